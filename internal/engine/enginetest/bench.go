package enginetest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

// FeedBenchRecords is how many completed records BenchAbandoned puts beside the
// abandoned keys: IDEMD_FEED_RECORDS, else 100,000 (docs/benchmarks.md has the figure
// for 1,000,000).
func FeedBenchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("IDEMD_FEED_RECORDS")); err == nil && n >= 0 {
		return n
	}
	return 100_000
}

// BenchAbandoned measures reading a tenant's whole abandoned-keys feed, 100 keys a
// page, on stores that newStore makes, in three states of the same kind of store: 100
// abandoned keys alone; the same beside FeedBenchRecords completed records of the
// tenant; and 1,000 abandoned keys. The first two should cost the same, the feed's cost
// growing with the pending keys, never with all the records; the third shows that
// growth. Each op is one full read of the feed; it reports the keys read per op.
func BenchAbandoned(b *testing.B, newStore func(b *testing.B) engine.Store) {
	for _, c := range []struct {
		name                string
		abandoned, finished int
	}{
		{"abandoned=100/records=0", 100, 0},
		{fmt.Sprintf("abandoned=100/records=%d", FeedBenchRecords()), 100, FeedBenchRecords()},
		{"abandoned=1000/records=0", 1000, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := newStore(b)
			defer s.Close()
			tenant := fmt.Sprintf("bench%d", seq.Add(1))
			fill(b, s, tenant, c.finished, c.abandoned)
			before := time.Now()
			b.ResetTimer()
			for b.Loop() {
				if n := readFeed(b, s, tenant, before); n != c.abandoned {
					b.Fatalf("the feed listed %d keys, want %d", n, c.abandoned)
				}
			}
			b.ReportMetric(float64(c.abandoned), "keys/op")
		})
	}
}

func readFeed(b *testing.B, s engine.Store, tenant string, before time.Time) int {
	q := engine.AbandonedQuery{Tenant: tenant, Prefix: "orders/", Before: before, Limit: engine.DefaultAbandonedLimit}
	n := 0
	for pages := 0; pages < 10_000; pages++ {
		page, err := s.Abandoned(context.Background(), q)
		if err != nil {
			b.Fatal(err)
		}
		n += len(page.Keys)
		if page.Next == "" {
			return n
		}
		q.Cursor = page.Next
	}
	b.Fatal("the feed did not end in 10,000 pages")
	return n
}

// fill completes finished keys and leaves abandoned ones pending under a lease that
// has run out, all under the prefix the benchmark reads, through the store's own
// transitions, 256 at a time.
func fill(b *testing.B, s engine.Store, tenant string, finished, abandoned int) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for range 256 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= finished+abandoned || failed.Load() != nil {
					return
				}
				id := engine.ID{Tenant: tenant, Key: fmt.Sprintf("orders/%09d", i)}
				c := engine.Claim{ID: id, Lease: 100 * time.Millisecond, Retention: time.Hour, Token: engine.NewLeaseToken()}
				if _, err := s.Claim(ctx, c); err != nil {
					failed.Store(&err)
					return
				}
				if i < finished {
					_, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
						Response: engine.Response{Status: 200}})
					if err != nil {
						failed.Store(&err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatalf("filling the store: %v", *err)
	}
	b.Logf("%d completed and %d abandoned records in %s", finished, abandoned, time.Since(start).Round(time.Millisecond))
	last := time.Now()
	wait.For(b, 10*time.Second, "the last lease to run out", func() bool { return time.Since(last) > 110*time.Millisecond })
}
