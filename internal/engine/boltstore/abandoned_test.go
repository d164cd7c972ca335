package boltstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/enginetest"
)

// TestPendingIndexBuiltOnOpen: a database written before the feed's index existed gets
// one when it opens, from its records, and the sweeper removes the entry of a pending
// record that expires.
func TestPendingIndexBuiltOnOpen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idemd.db")
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	s, err := boltstore.Open(path, boltstore.Options{Now: clk.Now, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	claim := func(s *boltstore.Store, key string, retention time.Duration) string {
		t.Helper()
		c := engine.Claim{ID: engine.ID{Tenant: "t", Key: key}, Lease: time.Second, Retention: retention, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c.Token
	}
	claim(s, "a/left", time.Hour)
	done := claim(s, "a/done", time.Hour)
	if _, err := s.Complete(ctx, engine.Completion{ID: engine.ID{Tenant: "t", Key: "a/done"}, LeaseToken: done, Retention: time.Hour,
		Response: engine.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	claim(s, "a/short", time.Minute)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := boltstore.DropPendingIndex(path); err != nil {
		t.Fatal(err)
	}

	s = open(t, path, boltstore.Options{Now: clk.Now, SweepInterval: time.Hour})
	clk.advance(2 * time.Second)
	list := func() []string {
		t.Helper()
		page, err := s.Abandoned(ctx, engine.AbandonedQuery{Tenant: "t", Prefix: "a/", Before: clk.Now(), Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, k := range page.Keys {
			keys = append(keys, k.Key)
		}
		return keys
	}
	if got := list(); len(got) != 2 || got[0] != "a/left" || got[1] != "a/short" {
		t.Fatalf("abandoned after the index was built on open: %q, want a/left and a/short", got)
	}
	clk.advance(2 * time.Minute)
	if n, err := s.Sweep(); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v, want the one expired record", n, err)
	}
	if n, err := boltstore.PendingEntries(s); err != nil || n != 1 {
		t.Fatalf("pending index after the sweep: %d entries %v, want 1", n, err)
	}
}

// BenchmarkAbandoned: go test -run '^$' -bench Abandoned ./internal/engine/boltstore
// (IDEMD_FEED_RECORDS=1000000 for the figure in docs/benchmarks.md).
func BenchmarkAbandoned(b *testing.B) {
	enginetest.BenchAbandoned(b, func(b *testing.B) engine.Store {
		s, err := boltstore.Open(filepath.Join(b.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return s
	})
}
