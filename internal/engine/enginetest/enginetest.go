// Package enginetest is the conformance suite every engine.Store must pass. It is
// written once against the interface and run, unchanged, on each store.
package enginetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

// NewStore returns a fresh, empty store for one test; the suite closes it.
type NewStore func(t *testing.T) engine.Store

// Run runs the whole suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	tests := []struct {
		name string
		run  func(t *testing.T, s engine.Store)
	}{
		{"first claim acquires attempt 1", testFirstClaim},
		{"second claim is in progress with retry-after", testInProgress},
		{"claim with the live lease's secret gets it back, an owner name grants nothing", testReentrant},
		{"an empty fingerprint matches only an empty one", testEmptyFingerprint},
		{"expired lease is taken over and the old token is dead", testTakeover},
		{"extend renews the lease", testExtend},
		{"transitions on a missing key are not found", testNotFound},
		{"lookup shows the record", testLookup},
		{"purge deletes and frees the key", testPurge},
		{"tenants have separate key spaces", testTenants},
		{"keys are any UTF-8", testOddKeys},
		{"records expire after their retention", testRetention},
		{"watch fires on complete, release and purge", testWatch},
		{"concurrent claimers acquire once", testStorm},
		{feedTest, testAbandoned},
		{usageTest, testUsage},
	}
	t.Run("the rules", func(t *testing.T) {
		s := newStore(t)
		t.Cleanup(func() { _ = s.Close() })
		RunRules(t, s)
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { _ = s.Close() })
			if mixed(s) && tc.name == usageTest {
				t.Skip("daemons of a release before usage counting do not count what they write")
			}
			if mixed(s) && tc.name == feedTest {
				t.Skip("daemons of a release before the feed do not index what they write")
			}
			tc.run(t, s)
		})
	}
}

const feedTest = "abandoned keys are listed by tenant and prefix, page by page"

var seq atomic.Int64

func newID() engine.ID {
	return engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("key-%d-%d", time.Now().UnixNano(), seq.Add(1))}
}

func claim(id engine.ID, mods ...func(*engine.Claim)) engine.Claim {
	c := engine.Claim{ID: id, Lease: 30 * time.Second, Retention: time.Hour, Token: engine.NewLeaseToken()}
	for _, m := range mods {
		m(&c)
	}
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustAcquire(t *testing.T, s engine.Store, c engine.Claim) engine.Record {
	t.Helper()
	res, err := s.Claim(ctx(t), c)
	if err != nil {
		t.Fatalf("claim %q: %v", c.ID.Key, err)
	}
	if res.Outcome != engine.OutcomeAcquired {
		t.Fatalf("claim %q: outcome %q, want acquired", c.ID.Key, res.Outcome)
	}
	if res.Record.LeaseToken != c.Token && c.Owner == "" {
		t.Fatalf("claim %q: token %q, want the claim's %q", c.ID.Key, res.Record.LeaseToken, c.Token)
	}
	return res.Record
}

func response(body string) engine.Response {
	return engine.Response{
		Status:  201,
		Headers: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body:    []byte(body),
	}
}

func complete(t *testing.T, s engine.Store, id engine.ID, token string, r engine.Response) engine.Record {
	t.Helper()
	rec, err := s.Complete(ctx(t), engine.Completion{ID: id, LeaseToken: token, Response: r, Retention: time.Hour})
	if err != nil {
		t.Fatalf("complete %q: %v", id.Key, err)
	}
	return rec
}

func testFirstClaim(t *testing.T, s engine.Store) {
	id := newID()
	before := time.Now().Add(-time.Second)
	rec := mustAcquire(t, s, claim(id, func(c *engine.Claim) { c.Fingerprint = "fp"; c.Owner = "w1" }))
	if rec.Attempt != 1 || rec.Recovered || rec.State != engine.StatePending {
		t.Fatalf("got attempt %d recovered %v state %s, want 1 false pending", rec.Attempt, rec.Recovered, rec.State)
	}
	if rec.ID != id || rec.Fingerprint != "fp" || rec.Owner != "w1" {
		t.Fatalf("record %+v does not carry the claim's id, fingerprint and owner", rec)
	}
	if rec.LeaseExpiresAt.Before(before.Add(29*time.Second)) || rec.LeaseExpiresAt.After(time.Now().Add(31*time.Second)) {
		t.Fatalf("lease expires at %s, want about 30s from now", rec.LeaseExpiresAt)
	}
}

func testInProgress(t *testing.T, s engine.Store) {
	id := newID()
	start := time.Now()
	mustAcquire(t, s, claim(id))
	_, err := s.Claim(ctx(t), claim(id))
	// The lease ran for at most this long (and a millisecond of rounding) before the
	// second claim.
	ran := time.Since(start) + time.Millisecond
	var busy *engine.InProgressError
	if !errors.As(err, &busy) || !errors.Is(err, engine.ErrInProgress) {
		t.Fatalf("second claim: %v, want in progress", err)
	}
	if busy.RetryAfter < 30*time.Second-ran || busy.RetryAfter > 30*time.Second {
		t.Fatalf("retry after %s, want what is left of the 30s lease, at least %s", busy.RetryAfter, 30*time.Second-ran)
	}
}

func testReentrant(t *testing.T, s engine.Store) {
	id := newID()
	secret := engine.HashSecret("secret-of-the-first-claim-0001")
	first := mustAcquire(t, s, claim(id, func(c *engine.Claim) { c.Owner = "worker-7"; c.Secret = secret }))
	res, err := s.Claim(ctx(t), claim(id, func(c *engine.Claim) { c.Owner = "worker-7"; c.Secret = secret }))
	if err != nil || res.Outcome != engine.OutcomeAcquired {
		t.Fatalf("re-entrant claim: %v %v", res.Outcome, err)
	}
	if res.Record.LeaseToken != first.LeaseToken || res.Record.Attempt != 1 {
		t.Fatalf("re-entrant claim got token %q attempt %d, want %q attempt 1", res.Record.LeaseToken, res.Record.Attempt, first.LeaseToken)
	}
	// The same owner name with another secret, or with none, is another claimer.
	for _, other := range []string{engine.HashSecret("secret-of-another-claim-0002"), ""} {
		if _, err := s.Claim(ctx(t), claim(id, func(c *engine.Claim) { c.Owner = "worker-7"; c.Secret = other })); !errors.Is(err, engine.ErrInProgress) {
			t.Fatalf("claim by the same owner name with secret %q: %v, want in progress", other, err)
		}
	}
}

func testEmptyFingerprint(t *testing.T, s engine.Store) {
	for _, tc := range []struct{ first, second string }{{"", "fp"}, {"fp", ""}} {
		id := newID()
		c := claim(id, func(c *engine.Claim) { c.Fingerprint = tc.first })
		mustAcquire(t, s, c)
		if _, err := s.Claim(ctx(t), claim(id, func(c *engine.Claim) { c.Fingerprint = tc.second })); !errors.Is(err, engine.ErrFingerprintMismatch) {
			t.Fatalf("pending key claimed with %q, then %q: %v, want fingerprint mismatch", tc.first, tc.second, err)
		}
		complete(t, s, id, c.Token, response("done"))
		if _, err := s.Claim(ctx(t), claim(id, func(c *engine.Claim) { c.Fingerprint = tc.second })); !errors.Is(err, engine.ErrFingerprintMismatch) {
			t.Fatalf("completed key claimed with %q, then %q: %v, want fingerprint mismatch", tc.first, tc.second, err)
		}
	}
}

func testTakeover(t *testing.T, s engine.Store) {
	id := newID()
	old := claim(id, func(c *engine.Claim) { c.Lease = 100 * time.Millisecond })
	mustAcquire(t, s, old)
	var res engine.ClaimResult
	next := claim(id)
	wait.For(t, 10*time.Second, "the lease to expire", func() bool {
		var err error
		res, err = s.Claim(ctx(t), next)
		return err == nil
	})
	if res.Outcome != engine.OutcomeAcquired || !res.Record.Recovered || res.Record.Attempt != 2 {
		t.Fatalf("takeover: %s recovered %v attempt %d, want acquired true 2", res.Outcome, res.Record.Recovered, res.Record.Attempt)
	}
	if _, err := s.Complete(ctx(t), engine.Completion{ID: id, LeaseToken: old.Token, Response: response("late"), Retention: time.Hour}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("complete by the old holder: %v, want lease lost", err)
	}
	if _, err := s.Extend(ctx(t), engine.Extension{ID: id, LeaseToken: old.Token, Lease: time.Second}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("extend by the old holder: %v, want lease lost", err)
	}
	complete(t, s, id, next.Token, response("new"))
}

func testExtend(t *testing.T, s engine.Store) {
	id := newID()
	c := claim(id, func(c *engine.Claim) { c.Lease = time.Second })
	rec := mustAcquire(t, s, c)
	ext, err := s.Extend(ctx(t), engine.Extension{ID: id, LeaseToken: c.Token, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	exp := ext.LeaseExpiresAt
	if exp.Before(rec.LeaseExpiresAt.Add(50 * time.Second)) {
		t.Fatalf("extended lease ends %s, want about a minute after %s", exp, rec.LeaseExpiresAt)
	}
	if ext.ExpiresAt.Before(exp) || ext.State != engine.StatePending || ext.ID != id {
		t.Fatalf("extend answered record %+v, want it pending and kept at least as long as its lease", ext)
	}
	got, err := s.Lookup(ctx(t), id)
	if err != nil || !got.LeaseExpiresAt.Equal(exp) {
		t.Fatalf("lookup after extend: lease %s %v, want %s", got.LeaseExpiresAt, err, exp)
	}
	complete(t, s, id, c.Token, response("done"))
	if _, err := s.Extend(ctx(t), engine.Extension{ID: id, LeaseToken: c.Token, Lease: time.Minute}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("extend after complete: %v, want lease lost", err)
	}
}

func testNotFound(t *testing.T, s engine.Store) {
	id := newID()
	tok := engine.NewLeaseToken()
	if _, err := s.Complete(ctx(t), engine.Completion{ID: id, LeaseToken: tok, Response: response("x"), Retention: time.Hour}); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("complete: %v", err)
	}
	if _, err := s.Release(ctx(t), engine.Release{ID: id, LeaseToken: tok, Mode: engine.ReleaseRetry, Retention: time.Hour}); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("release: %v", err)
	}
	if _, err := s.Extend(ctx(t), engine.Extension{ID: id, LeaseToken: tok, Lease: time.Second}); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("extend: %v", err)
	}
	if _, err := s.Lookup(ctx(t), id); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("lookup: %v", err)
	}
	if err := s.Purge(ctx(t), id); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("purge: %v", err)
	}
	// None of them may have created the record.
	if _, err := s.Lookup(ctx(t), id); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("lookup after the failed transitions: %v", err)
	}
}

func testLookup(t *testing.T, s engine.Store) {
	id := newID()
	c := claim(id, func(c *engine.Claim) { c.Fingerprint = "f"; c.Owner = "o" })
	mustAcquire(t, s, c)
	rec, err := s.Lookup(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != engine.StatePending || rec.Attempt != 1 || rec.Fingerprint != "f" || rec.Owner != "o" || rec.Response != nil {
		t.Fatalf("pending record %+v", rec)
	}
	if rec.CreatedAt.IsZero() || rec.UpdatedAt.Before(rec.CreatedAt) || !rec.ExpiresAt.After(rec.LeaseExpiresAt.Add(-time.Millisecond)) {
		t.Fatalf("timestamps: created %s updated %s lease %s expires %s", rec.CreatedAt, rec.UpdatedAt, rec.LeaseExpiresAt, rec.ExpiresAt)
	}
	complete(t, s, id, c.Token, response("body"))
	rec, err = s.Lookup(ctx(t), id)
	if err != nil || rec.State != engine.StateCompleted || rec.Response == nil || string(rec.Response.Body) != "body" {
		t.Fatalf("completed record %+v %v", rec, err)
	}
	if !rec.LeaseExpiresAt.IsZero() {
		t.Fatalf("a completed record shows a lease expiry %s", rec.LeaseExpiresAt)
	}
	if d := time.Until(rec.ExpiresAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("completed record expires in %s, want its one-hour retention", d)
	}
}

func testPurge(t *testing.T, s engine.Store) {
	id := newID()
	c := claim(id)
	mustAcquire(t, s, c)
	complete(t, s, id, c.Token, response("x"))
	if err := s.Purge(ctx(t), id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx(t), id); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("lookup after purge: %v", err)
	}
	if rec := mustAcquire(t, s, claim(id)); rec.Attempt != 1 {
		t.Fatalf("claim after purge: attempt %d, want 1", rec.Attempt)
	}
}

func testTenants(t *testing.T, s engine.Store) {
	a := engine.ID{Tenant: "team-a", Key: "order-1-" + newID().Key}
	b := engine.ID{Tenant: "team-b", Key: a.Key}
	ca := claim(a)
	mustAcquire(t, s, ca)
	cb := claim(b)
	mustAcquire(t, s, cb)
	complete(t, s, a, ca.Token, response("a"))
	if _, err := s.Complete(ctx(t), engine.Completion{ID: b, LeaseToken: ca.Token, Response: response("x"), Retention: time.Hour}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("tenant a's token on tenant b's record: %v, want lease lost", err)
	}
	rec, err := s.Lookup(ctx(t), b)
	if err != nil || rec.State != engine.StatePending || rec.ID != b {
		t.Fatalf("tenant b's record: %+v %v", rec, err)
	}
	if err := s.Purge(ctx(t), b); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Lookup(ctx(t), a); err != nil || rec.State != engine.StateCompleted {
		t.Fatalf("purging tenant b's record touched tenant a's: %+v %v", rec, err)
	}
}

func testOddKeys(t *testing.T, s engine.Store) {
	for _, key := range []string{"a/b?c#d e", "日本語キー", "%2F..%00", string(bytes.Repeat([]byte("k"), engine.MaxKeyBytes))} {
		id := engine.ID{Tenant: engine.DefaultTenant, Key: key}
		_ = s.Purge(ctx(t), id)
		c := claim(id)
		mustAcquire(t, s, c)
		complete(t, s, id, c.Token, response(key))
		rec, err := s.Lookup(ctx(t), id)
		if err != nil || rec.ID.Key != key || string(rec.Response.Body) != key {
			t.Fatalf("key %q: %+v %v", key, rec, err)
		}
	}
}

func testRetention(t *testing.T, s engine.Store) {
	id := newID()
	c := claim(id)
	mustAcquire(t, s, c)
	if _, err := s.Complete(ctx(t), engine.Completion{ID: id, LeaseToken: c.Token, Response: response("short"), Retention: 150 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the record to expire", func() bool {
		_, err := s.Lookup(ctx(t), id)
		return errors.Is(err, engine.ErrNotFound)
	})
	if rec := mustAcquire(t, s, claim(id)); rec.Attempt != 1 {
		t.Fatalf("claim after expiry: attempt %d, want 1", rec.Attempt)
	}
}

func testWatch(t *testing.T, s engine.Store) {
	transitions := map[string]func(id engine.ID, token string) error{
		"complete": func(id engine.ID, token string) error {
			_, err := s.Complete(ctx(t), engine.Completion{ID: id, LeaseToken: token, Response: response("w"), Retention: time.Hour})
			return err
		},
		"release": func(id engine.ID, token string) error {
			_, err := s.Release(ctx(t), engine.Release{ID: id, LeaseToken: token, Mode: engine.ReleaseRetry, Retention: time.Hour})
			return err
		},
		"purge": func(id engine.ID, _ string) error { return s.Purge(ctx(t), id) },
	}
	for name, transition := range transitions {
		id := newID()
		c := claim(id)
		mustAcquire(t, s, c)
		w, err := s.Watch(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if err := transition(id, c.Token); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		select {
		case <-w.C():
		case <-time.After(5 * time.Second):
			t.Fatalf("no notification within 5s after %s", name)
		}
		w.Close()
	}
}

func testStorm(t *testing.T, s engine.Store) {
	const keys, claimers = 50, 20
	var acquired [keys]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, keys*claimers)
	base := newID().Key
	for k := range keys {
		id := engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("%s-%d", base, k)}
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := s.Claim(context.Background(), claim(id))
				switch {
				case err == nil && res.Outcome == engine.OutcomeAcquired:
					acquired[k].Add(1)
				case errors.Is(err, engine.ErrInProgress):
				default:
					errs <- fmt.Errorf("key %d: %v %v", k, res.Outcome, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k := range keys {
		if n := acquired[k].Load(); n != 1 {
			t.Errorf("key %d acquired %d times, want once", k, n)
		}
	}
}
