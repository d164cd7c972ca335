package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/lintest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// earlierScripts are the scripts of the release before records became strings: they
// keep each record as a hash and read nothing else. previousScripts are the scripts of
// the release before the lean layout: strings at the earlier keys, and hashes.
const (
	earlierScripts  = "testdata/hash-records"
	previousScripts = "testdata/string-records"
)

// TestRollingUpgrade runs daemons of two kinds over one Redis, as a rolling upgrade
// does (docs/upgrading.md): daemons of the release before strings beside daemons of
// this one writing hashes (HashRecords), then beside daemons writing strings; daemons of
// the release before the lean layout beside daemons of this one as they start
// (strings), and each step of the move to the lean layout beside the next: strings,
// lean ready, lean, lean only. At each step every call goes to the next daemon in
// turn, and the conformance suite and the linearizability check must pass as they do on
// one daemon.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	scripts := func(dir string) func(testing.TB) engine.Store {
		return func(t testing.TB) engine.Store {
			s, err := redisstore.OpenWithScripts(srv.URL(), redisstore.Options{}, dir)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	layout := func(opts redisstore.Options) func(testing.TB) engine.Store {
		return func(t testing.TB) engine.Store {
			s, err := redisstore.OpenWith(srv.URL(), opts)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	hashes, strs := layout(redisstore.Options{HashRecords: true}), layout(redisstore.Options{})
	ready, lean := layout(redisstore.Options{LeanReady: true}), layout(redisstore.Options{LeanRecords: true})
	leanOnly := layout(redisstore.Options{LeanRecords: true, LeanOnly: true})
	for _, step := range []struct {
		name    string
		a, b    func(testing.TB) engine.Store
		earlier bool
	}{
		{"the release before strings beside hashes", scripts(earlierScripts), hashes, true},
		{"hashes beside strings", hashes, strs, false},
		{"the release before the lean layout beside strings", scripts(previousScripts), strs, true},
		{"strings beside lean ready", strs, ready, false},
		{"lean ready beside lean", ready, lean, false},
		{"lean beside lean only", lean, leanOnly, false},
	} {
		t.Run(step.name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T) engine.Store {
				return &rotating{stores: []engine.Store{step.a(t), step.b(t)}, earlier: step.earlier}
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
// front of several daemons does. When earlier is set the first store runs the scripts
// of a release before recovery points and the abandoned-keys feed: such a daemon has
// no route for them, so they go to the last store, and its writes may drop recovery
// points and leave the feed's index as it was (enginetest.Mixed).
type rotating struct {
	stores  []engine.Store
	n       atomic.Uint64
	earlier bool
}

func (r *rotating) WithEarlierRelease() bool { return r.earlier }

func (r *rotating) Abandoned(ctx context.Context, q engine.AbandonedQuery) (engine.AbandonedPage, error) {
	if r.earlier {
		return r.stores[len(r.stores)-1].Abandoned(ctx, q)
	}
	return r.next().Abandoned(ctx, q)
}

// Usage is read through the daemons in turn, as the transitions are: each counts what
// the other wrote, once the other has sent its counts, as a daemon does within
// usageFlushEvery; here each sends them before the read.
func (r *rotating) Usage(ctx context.Context, tenant string) (engine.Usage, error) {
	for _, s := range r.stores {
		if err := s.(*redisstore.Store).SendUsage(ctx); err != nil {
			return engine.Usage{}, err
		}
	}
	return r.next().(engine.UsageReader).Usage(ctx, tenant)
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

func (r *rotating) Mark(ctx context.Context, m engine.Mark) (engine.Record, error) {
	if r.earlier {
		return r.stores[len(r.stores)-1].Mark(ctx, m)
	}
	return r.next().Mark(ctx, m)
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

// TestLeanReadsThePreviousRelease: records the release before the lean layout wrote
// (pending, completed, failed; a middleware's fingerprint, headers) read the same
// through a daemon writing the lean layout, which takes each over and moves it to its
// lean key at its next transition, leaving nothing at the earlier key.
func TestLeanReadsThePreviousRelease(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	old, err := redisstore.OpenWithScripts(srv.URL(), redisstore.Options{}, previousScripts)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	lean, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lean.Close()
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := t.Context()
	fp := "sha256:" + strings.Repeat("0a", 32)
	headers := map[string][]string{"content-type": {"application/json"}, "Location": {"/orders/1"}}

	held := engine.ID{Tenant: engine.DefaultTenant, Key: "held"}
	c := engine.Claim{ID: held, Fingerprint: fp, Secret: strings.Repeat("5e", 32), Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	if _, err := old.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	before, err := old.Lookup(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	got, err := lean.Lookup(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	if got.Fingerprint != fp || got.LeaseToken != c.Token || got.Attempt != 1 || !got.LeaseExpiresAt.Equal(before.LeaseExpiresAt) {
		t.Fatalf("the lean daemon reads %+v, the previous release wrote %+v", got, before)
	}
	// The claim resent with its secret gets its lease back through the lean daemon.
	again := c
	again.Token = engine.NewLeaseToken()
	res, err := lean.Claim(ctx, again)
	if err != nil || res.Outcome != engine.OutcomeAcquired || res.Record.LeaseToken != c.Token {
		t.Fatalf("a resent claim through the lean daemon: %+v, %v", res, err)
	}
	// Another fingerprint is refused; the same one in another form is not the same.
	if _, err := lean.Claim(ctx, engine.Claim{ID: held, Fingerprint: strings.Repeat("0a", 32), Lease: time.Minute,
		Retention: time.Hour, Token: engine.NewLeaseToken()}); !errors.Is(err, engine.ErrFingerprintMismatch) {
		t.Fatalf("a claim with another fingerprint: %v, want a mismatch", err)
	}
	if _, err := lean.Complete(ctx, engine.Completion{ID: held, LeaseToken: c.Token, Retention: time.Hour,
		Response: engine.Response{Status: 201, Headers: headers, Body: []byte("done")}}); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Exists(ctx, redisstore.RecordKey(held)).Result(); err != nil || n != 0 {
		t.Fatalf("the earlier key still exists (%d, %v) after the lean daemon's transition", n, err)
	}
	done, err := lean.Lookup(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != engine.StateCompleted || done.Response == nil || done.Response.Status != 201 ||
		string(done.Response.Body) != "done" || done.Response.Headers["Location"][0] != "/orders/1" ||
		done.Response.Headers["content-type"][0] != "application/json" || done.Fingerprint != fp || done.Attempt != 1 {
		t.Fatalf("the completed record reads %+v", done)
	}
	// A repeated completion with the same token is still recognised.
	if _, err := lean.Complete(ctx, engine.Completion{ID: held, LeaseToken: c.Token, Retention: time.Hour,
		Response: engine.Response{Status: 201}}); err != nil {
		t.Fatalf("the same completion again: %v", err)
	}

	// A completed record of the previous release replays through the lean daemon.
	finished := engine.ID{Tenant: engine.DefaultTenant, Key: "finished"}
	c2 := engine.Claim{ID: finished, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	if _, err := old.Claim(ctx, c2); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Complete(ctx, engine.Completion{ID: finished, LeaseToken: c2.Token, Retention: time.Hour,
		Response: engine.Response{Status: 200, Headers: headers, Body: []byte("first")}}); err != nil {
		t.Fatal(err)
	}
	replay, err := lean.Claim(ctx, engine.Claim{ID: finished, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
	if err != nil || replay.Outcome != engine.OutcomeCompleted || string(replay.Record.Response.Body) != "first" ||
		replay.Record.Response.Headers["Location"][0] != "/orders/1" {
		t.Fatalf("a replay of the previous release's result: %+v, %v", replay, err)
	}
}

// TestLeanRecordsAreSmaller guards the point of the lean layout: a completed record
// with the middleware's default headers takes less memory in Redis than the same record
// as a string of the previous layout.
func TestLeanRecordsAreSmaller(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := t.Context()
	usage := map[string]int64{}
	for name, opts := range map[string]redisstore.Options{"strings": {}, "lean": {LeanRecords: true}} {
		s, err := redisstore.OpenWith(srv.URL(), opts)
		if err != nil {
			t.Fatal(err)
		}
		id := engine.ID{Tenant: engine.DefaultTenant, Key: "idempotency-key:v1:" + strings.Repeat("c4", 32) + name}
		c := engine.Claim{ID: id, Fingerprint: "sha256:" + strings.Repeat("9f", 32), Secret: strings.Repeat("e3", 32),
			Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
			Response: engine.Response{Status: 201, Headers: map[string][]string{"content-type": {"application/json"}, "location": {"/orders/42"}}}}); err != nil {
			t.Fatal(err)
		}
		key := redisstore.RecordKey(id)
		if opts.LeanRecords {
			key = redisstore.LeanKey(id)
		}
		n, err := client.MemoryUsage(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		usage[name] = n
		s.Close()
	}
	if usage["lean"] >= usage["strings"] {
		t.Fatalf("MEMORY USAGE: lean %d bytes, strings %d", usage["lean"], usage["strings"])
	}
	t.Logf("MEMORY USAGE of a completed middleware record: lean %d bytes, strings %d", usage["lean"], usage["strings"])
}
