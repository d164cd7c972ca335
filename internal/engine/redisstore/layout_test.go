package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/lintest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testredis"
	"github.com/idemd/idemd/internal/wait"
)

// earlierScripts are the scripts of the release before records became strings: they
// keep each record as a hash and read nothing else.
const earlierScripts = "testdata/hash-records"

// TestRollingUpgrade runs daemons of two kinds over one Redis, as a rolling upgrade
// does (docs/operations.md): first daemons of the earlier release beside daemons of
// this one writing hashes (HashRecords), then daemons writing hashes beside daemons
// writing strings. At each step every call goes to the next daemon in turn, and the
// conformance suite and the linearizability check must pass as they do on one daemon.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	earlier := func(t testing.TB) engine.Store {
		s, err := redisstore.OpenWithScripts(srv.URL(), redisstore.Options{}, earlierScripts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	layout := func(hashRecords bool) func(testing.TB) engine.Store {
		return func(t testing.TB) engine.Store {
			s, err := redisstore.OpenWith(srv.URL(), redisstore.Options{HashRecords: hashRecords})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	for _, step := range []struct {
		name string
		a, b func(testing.TB) engine.Store
	}{
		{"the earlier release beside hashes", earlier, layout(true)},
		{"hashes beside strings", layout(true), layout(false)},
	} {
		t.Run(step.name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T) engine.Store {
				return &rotating{stores: []engine.Store{step.a(t), step.b(t)}}
			})
			s := &rotating{stores: []engine.Store{step.a(t), step.b(t)}}
			defer s.Close()
			h := lintest.Run(t, s, lintest.Config{Clients: 8, Keys: 6, OpsPerClient: 150})
			if res := h.Check(t, "redis"); res != porcupine.Ok {
				t.Fatalf("%d calls through two daemons: %s", len(h.Ops), res)
			}
		})
	}
}

// TestEarlierReleaseFailsClosedOnStrings: a daemon of the earlier release that meets a
// record written as a string (a rolling upgrade done without HashRecords) answers
// unavailable, and never acquires the key or changes the record.
func TestEarlierReleaseFailsClosedOnStrings(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	now, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	old, err := redisstore.OpenWithScripts(srv.URL(), redisstore.Options{}, earlierScripts)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	ctx := t.Context()

	done := engine.ID{Tenant: engine.DefaultTenant, Key: "done"}
	c := engine.Claim{ID: done, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	if _, err := now.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := now.Complete(ctx, engine.Completion{ID: done, LeaseToken: c.Token, Retention: time.Hour,
		Response: engine.Response{Status: 201, Body: []byte("first")}}); err != nil {
		t.Fatal(err)
	}
	// A lease of 100 ms that has run out: the earlier release would take the key over.
	lapsed := engine.ID{Tenant: engine.DefaultTenant, Key: "lapsed"}
	if _, err := now.Claim(ctx, engine.Claim{ID: lapsed, Lease: 100 * time.Millisecond, Retention: time.Hour,
		Token: engine.NewLeaseToken()}); err != nil {
		t.Fatal(err)
	}
	waitLeaseOut(t, now, lapsed)

	for _, id := range []engine.ID{done, lapsed} {
		before, err := now.Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		calls := map[string]error{}
		_, calls["claim"] = old.Claim(ctx, engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
		_, calls["complete"] = old.Complete(ctx, engine.Completion{ID: id, LeaseToken: before.LeaseToken, Retention: time.Hour,
			Response: engine.Response{Status: 500}})
		_, calls["lookup"] = old.Lookup(ctx, id)
		calls["purge"] = old.Purge(ctx, id)
		for name, err := range calls {
			if !errors.Is(err, engine.ErrUnavailable) {
				t.Errorf("%s of %q by the earlier release: %v, want unavailable", name, id.Key, err)
			}
		}
		after, err := now.Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if after.State != before.State || after.Attempt != before.Attempt || after.LeaseToken != before.LeaseToken ||
			!after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("%q changed under the earlier release: %+v, was %+v", id.Key, after, before)
		}
	}
}

// TestUnknownLayoutIsNotOverwritten: a record this release cannot read (a later
// layout) is refused as unavailable by every transition and left as it was.
func TestUnknownLayoutIsNotOverwritten(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := t.Context()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "from-the-future"}
	const later = "\x03\xa1x" // MessagePack: the layout 3, then "x"
	if err := client.Set(ctx, redisstore.RecordKey(id), later, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]error{}
	_, calls["claim"] = s.Claim(ctx, engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
	_, calls["complete"] = s.Complete(ctx, engine.Completion{ID: id, LeaseToken: "t", Retention: time.Hour})
	_, calls["release"] = s.Release(ctx, engine.Release{ID: id, LeaseToken: "t", Mode: engine.ReleaseRetry, Retention: time.Hour})
	_, calls["extend"] = s.Extend(ctx, engine.Extension{ID: id, LeaseToken: "t", Lease: time.Minute})
	_, calls["lookup"] = s.Lookup(ctx, id)
	calls["purge"] = s.Purge(ctx, id)
	for name, err := range calls {
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("%s of a record of a later layout: %v, want unavailable", name, err)
		}
	}
	if got, err := client.Get(ctx, redisstore.RecordKey(id)).Result(); err != nil || got != later {
		t.Errorf("the record is now %q (%v), want it untouched", got, err)
	}
}

// waitLeaseOut waits until the record's lease has run out by Redis's clock.
func waitLeaseOut(t *testing.T, s engine.Store, id engine.ID) {
	t.Helper()
	wait.For(t, 30*time.Second, "the lease of "+id.Key+" to run out", func() bool {
		rec, err := s.Lookup(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return time.Since(rec.LeaseExpiresAt) > 10*time.Millisecond
	})
}

// rotating sends each call to the next of its stores in turn, as a load balancer in
// front of several daemons does.
type rotating struct {
	stores []engine.Store
	n      atomic.Uint64
}

func (r *rotating) next() engine.Store {
	return r.stores[r.n.Add(1)%uint64(len(r.stores))]
}

func (r *rotating) Claim(ctx context.Context, c engine.Claim) (engine.ClaimResult, error) {
	return r.next().Claim(ctx, c)
}

func (r *rotating) Complete(ctx context.Context, c engine.Completion) (engine.Record, error) {
	return r.next().Complete(ctx, c)
}

func (r *rotating) Release(ctx context.Context, rel engine.Release) (engine.Record, error) {
	return r.next().Release(ctx, rel)
}

func (r *rotating) Extend(ctx context.Context, e engine.Extension) (engine.Record, error) {
	return r.next().Extend(ctx, e)
}

func (r *rotating) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	return r.next().Lookup(ctx, id)
}

func (r *rotating) Purge(ctx context.Context, id engine.ID) error { return r.next().Purge(ctx, id) }

func (r *rotating) Watch(ctx context.Context, id engine.ID) (engine.Watch, error) {
	return r.next().Watch(ctx, id)
}

func (r *rotating) Ping(ctx context.Context) error { return r.next().Ping(ctx) }

func (r *rotating) Close() error {
	var errs []error
	for _, s := range r.stores {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
