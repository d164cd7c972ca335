package enginetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

// testAbandoned: the feed lists the pending keys under a prefix whose leases ran out,
// with their attempt, owner and recovery point, page by page; not the keys whose lease
// is live, that are finished or released, under another prefix or of another tenant;
// and a key taken over leaves it.
func testAbandoned(t *testing.T, s engine.Store) {
	tenant := fmt.Sprintf("feed%d", seq.Add(1))
	id := func(key string) engine.ID { return engine.ID{Tenant: tenant, Key: key} }
	short := func(c *engine.Claim) { c.Lease = 100 * time.Millisecond; c.Owner = "worker-1"; c.Fingerprint = "fp" }
	var want []string
	var last engine.Record
	for i := range 5 {
		key := fmt.Sprintf("orders/%d", i)
		last = mustAcquire(t, s, claim(id(key), short))
		if i == 2 {
			if _, err := s.Mark(ctx(t), engine.Mark{ID: id(key), LeaseToken: last.LeaseToken, Name: "charged"}); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, key)
	}
	done := mustAcquire(t, s, claim(id("orders/done"), short))
	complete(t, s, id("orders/done"), done.LeaseToken, response("done"))
	freed := mustAcquire(t, s, claim(id("orders/freed"), short))
	if _, err := s.Release(ctx(t), engine.Release{ID: id("orders/freed"), LeaseToken: freed.LeaseToken, Mode: engine.ReleaseRetry, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, claim(id("orders/live")))
	mustAcquire(t, s, claim(id("emails/1"), short))
	mustAcquire(t, s, claim(engine.ID{Tenant: tenant + "x", Key: "orders/other-tenant"}, short))
	wait.For(t, 10*time.Second, "the short leases to run out", func() bool {
		return time.Now().After(last.LeaseExpiresAt.Add(5 * time.Millisecond))
	})

	list := func(limit int) []engine.AbandonedKey {
		t.Helper()
		var keys []engine.AbandonedKey
		q := engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: time.Now(), Limit: limit}
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatalf("more than 20 pages of %d for %d keys", limit, len(want))
			}
			page, err := s.Abandoned(ctx(t), q)
			if err != nil {
				t.Fatalf("abandoned: %v", err)
			}
			if len(page.Keys) > limit {
				t.Fatalf("a page of %d keys, over its limit of %d", len(page.Keys), limit)
			}
			keys = append(keys, page.Keys...)
			if page.Next == "" {
				return keys
			}
			q.Cursor = page.Next
		}
	}
	for _, limit := range []int{1, 2, 100} {
		keys := list(limit)
		var got []string
		for _, k := range keys {
			got = append(got, k.Key)
			point := ""
			if k.Key == "orders/2" {
				point = "charged"
			}
			if k.Attempt != 1 || k.Owner != "worker-1" || k.Fingerprint != "fp" || k.Point != point || k.LeaseExpiredAt.After(time.Now()) || k.LeaseExpiredAt.IsZero() {
				t.Errorf("limit %d: %+v, want attempt 1, owner worker-1, fingerprint fp, recovery point %q and a lease that ran out", limit, k, point)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: abandoned keys %q, want %q", limit, got, want)
		}
	}

	// A key taken over is held again, and no longer abandoned.
	mustAcquire(t, s, claim(id("orders/0"), func(c *engine.Claim) { c.Fingerprint = "fp" }))
	keys := list(100)
	if len(keys) != len(want)-1 || slices.ContainsFunc(keys, func(k engine.AbandonedKey) bool { return k.Key == "orders/0" }) {
		t.Fatalf("after a takeover of orders/0: %+v", keys)
	}
	// Only leases that ran out before Before count.
	page, err := s.Abandoned(ctx(t), engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: last.LeaseExpiresAt.Add(-time.Hour), Limit: 100})
	if err != nil || len(page.Keys) != 0 {
		t.Fatalf("leases that ran out an hour before the last: %+v %v, want none", page.Keys, err)
	}
	if _, err := s.Abandoned(ctx(t), engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: time.Now(), Limit: 10,
		Cursor: "\xff not a cursor"}); !errors.Is(err, engine.ErrBadCursor) {
		t.Fatalf("a malformed cursor: %v, want ErrBadCursor", err)
	}
}
