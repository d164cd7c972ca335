package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// BenchmarkAbandoned reads the abandoned-keys feed on a standalone Redis and on a
// Cluster of three masters: go test -run '^$' -bench Abandoned ./internal/engine/redisstore
// (IDEMD_FEED_RECORDS=1000000 for the figure in docs/benchmarks.md).
func BenchmarkAbandoned(b *testing.B) {
	b.Run("standalone", func(b *testing.B) {
		srv := testredis.Start(b)
		enginetest.BenchAbandoned(b, func(b *testing.B) engine.Store {
			s, err := redisstore.Open(srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	})
	b.Run("cluster", func(b *testing.B) {
		cluster := testredis.StartCluster(b)
		enginetest.BenchAbandoned(b, func(b *testing.B) engine.Store {
			s, err := redisstore.Open(cluster.URL())
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	})
}

// passKey marks the context of the feed's pass whose commands countHook counts.
type passKey struct{}

// countHook counts the commands sent under a context marked with passKey, pipelined or
// not.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Value(passKey{}) != nil {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(passKey{}) != nil {
			h.n.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// TestAbandonedPassCost: once a pass has swept the pending indexes, a pass over a
// tenant with live leases in many slots and finished records, but no abandoned key,
// sends a few commands, not one for each slot; with abandoned keys, a few more for
// each.
func TestAbandonedPassCost(t *testing.T) {
	for _, deployment := range []string{"standalone", "cluster"} {
		t.Run(deployment, func(t *testing.T) {
			var url string
			if deployment == "cluster" {
				url = testredis.StartCluster(t).URL()
			} else {
				url = testredis.Start(t).URL()
			}
			universal, err := redisstore.NewClient(url)
			if err != nil {
				t.Fatal(err)
			}
			hook := &countHook{}
			universal.AddHook(hook)
			client, err := redisstore.Adapt(universal)
			if err != nil {
				t.Fatal(err)
			}
			s := redisstore.New(client, redisstore.Options{})
			t.Cleanup(func() { _ = s.Close() })
			const tenant = "cost"
			for i := range 2000 {
				id := engine.ID{Tenant: tenant, Key: fmt.Sprintf("orders/%d", i)}
				res, err := s.Claim(t.Context(), engine.Claim{ID: id, Lease: time.Hour, Retention: time.Hour, Token: engine.NewLeaseToken()})
				if err != nil {
					t.Fatal(err)
				}
				if i%2 == 0 {
					if _, err := s.Complete(t.Context(), engine.Completion{ID: id, LeaseToken: res.Record.LeaseToken, Retention: time.Hour,
						Response: engine.Response{Status: 200}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			pass := func() (int, int64) {
				t.Helper()
				ctx := context.WithValue(t.Context(), passKey{}, true)
				before := hook.n.Load()
				q := engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: time.Now(), Limit: 100}
				n := 0
				for range 100 {
					page, err := s.Abandoned(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					n += len(page.Keys)
					if page.Next == "" {
						return n, hook.n.Load() - before
					}
					q.Cursor = page.Next
				}
				t.Fatal("the feed did not end in 100 pages")
				return 0, 0
			}
			if n, _ := pass(); n != 0 {
				t.Fatalf("the first pass listed %d keys, want none", n)
			}
			n, cmds := pass()
			t.Logf("a pass with no abandoned key: %d commands", cmds)
			if n != 0 || cmds > 4 {
				t.Fatalf("a pass with no abandoned key listed %d keys in %d commands, want none in at most 4", n, cmds)
			}

			// Ten keys abandoned: the pass reads their slots and looks them up.
			var last time.Time
			for i := range 10 {
				id := engine.ID{Tenant: tenant, Key: fmt.Sprintf("orders/abandoned-%d", i)}
				res, err := s.Claim(t.Context(), engine.Claim{ID: id, Lease: 50 * time.Millisecond, Retention: time.Hour, Token: engine.NewLeaseToken()})
				if err != nil {
					t.Fatal(err)
				}
				last = res.Record.LeaseExpiresAt
			}
			wait.For(t, 10*time.Second, "the short leases to run out", func() bool { return time.Now().After(last.Add(5 * time.Millisecond)) })
			n, cmds = pass()
			t.Logf("a pass with 10 abandoned keys: %d commands", cmds)
			if n != 10 || cmds > 4+4*10 {
				t.Fatalf("a pass with 10 abandoned keys listed %d keys in %d commands, want 10 in at most %d", n, cmds, 4+4*10)
			}
		})
	}
}

// TestAbandonedWithoutNote: a pending entry the due index was never told of (a daemon
// of an earlier release wrote it, or one killed before its note) is listed once a
// sweep has read its slot.
func TestAbandonedWithoutNote(t *testing.T) {
	srv := testredis.Start(t)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	const tenant = "unnoted"
	id := engine.ID{Tenant: tenant, Key: "orders/1"}
	res, err := s.Claim(t.Context(), engine.Claim{ID: id, Lease: 50 * time.Millisecond, Retention: time.Hour, Token: engine.NewLeaseToken()})
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the lease to run out", func() bool { return time.Now().After(res.Record.LeaseExpiresAt.Add(5 * time.Millisecond)) })
	q := engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: time.Now(), Limit: 100}
	if page, err := s.Abandoned(t.Context(), q); err != nil || len(page.Keys) != 1 {
		t.Fatalf("with its note: %+v %v, want orders/1", page.Keys, err)
	}
	// Lose the note; a pass before the next sweep does not see the key, the sweep does.
	if _, err := srv.Command("DEL", "\x00pending-due:"+tenant); err != nil {
		t.Fatal(err)
	}
	if page, err := s.Abandoned(t.Context(), q); err != nil || len(page.Keys) != 0 {
		t.Fatalf("without its note, before a sweep: %+v %v, want none", page.Keys, err)
	}
	if _, err := srv.Command("DEL", "\x00pending-swept:"+tenant); err != nil {
		t.Fatal(err)
	}
	if page, err := s.Abandoned(t.Context(), q); err != nil || len(page.Keys) != 1 || page.Keys[0].Key != "orders/1" {
		t.Fatalf("without its note, at a sweep: %+v %v, want orders/1", page.Keys, err)
	}
}

// BenchmarkAbandonedPass reads the whole feed of a tenant with 10 abandoned keys beside
// IDEMD_FEED_RECORDS live leases and as many finished records (enginetest's
// FeedBenchRecords, 100,000 unless set), on a standalone Redis and on a Cluster of
// three masters, and reports the commands a pass sends:
// go test -run '^$' -bench AbandonedPass ./internal/engine/redisstore
func BenchmarkAbandonedPass(b *testing.B) {
	for _, deployment := range []string{"standalone", "cluster"} {
		b.Run(deployment, func(b *testing.B) {
			var url string
			if deployment == "cluster" {
				url = testredis.StartCluster(b).URL()
			} else {
				url = testredis.Start(b).URL()
			}
			universal, err := redisstore.NewClient(url)
			if err != nil {
				b.Fatal(err)
			}
			hook := &countHook{}
			universal.AddHook(hook)
			client, err := redisstore.Adapt(universal)
			if err != nil {
				b.Fatal(err)
			}
			s := redisstore.New(client, redisstore.Options{})
			defer s.Close()
			const tenant = "bench"
			records := enginetest.FeedBenchRecords()
			var next atomic.Int64
			var failed atomic.Pointer[error]
			var wg sync.WaitGroup
			var lastExpiry atomic.Int64
			for range 128 {
				wg.Go(func() {
					for {
						i := int(next.Add(1)) - 1
						if i >= 2*records+10 || failed.Load() != nil {
							return
						}
						id := engine.ID{Tenant: tenant, Key: fmt.Sprintf("orders/%09d", i)}
						lease := time.Hour
						if i >= 2*records {
							lease = 50 * time.Millisecond
						}
						res, err := s.Claim(context.Background(), engine.Claim{ID: id, Lease: lease, Retention: time.Hour, Token: engine.NewLeaseToken()})
						if err == nil && i >= 2*records {
							lastExpiry.Store(res.Record.LeaseExpiresAt.UnixMilli())
						}
						if err == nil && i < records {
							_, err = s.Complete(context.Background(), engine.Completion{ID: id, LeaseToken: res.Record.LeaseToken, Retention: time.Hour,
								Response: engine.Response{Status: 200}})
						}
						if err != nil {
							failed.Store(&err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := failed.Load(); err != nil {
				b.Fatal(*err)
			}
			wait.For(b, 10*time.Second, "the short leases to run out", func() bool { return time.Now().UnixMilli() > lastExpiry.Load()+5 })
			before := time.Now()
			ctx := context.WithValue(context.Background(), passKey{}, true)
			// The first pass after the fill sweeps, as one does each minute.
			read := func() {
				q := engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: before, Limit: 100}
				n := 0
				for range 10_000 {
					page, err := s.Abandoned(ctx, q)
					if err != nil {
						b.Fatal(err)
					}
					n += len(page.Keys)
					if page.Next == "" {
						break
					}
					q.Cursor = page.Next
				}
				if n != 10 {
					b.Fatalf("the feed listed %d keys, want 10", n)
				}
			}
			read()
			start := hook.n.Load()
			b.ResetTimer()
			for b.Loop() {
				read()
			}
			b.ReportMetric(float64(hook.n.Load()-start)/float64(b.N), "commands/op")
		})
	}
}
