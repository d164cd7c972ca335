package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// BenchmarkLiveCopy measures the copier of a live move (Migrator.CopyAll, which a
// daemon started with --migrate-from runs) on liveCopyRecords completed records (a
// 200-byte response each), from the embedded store into a lean Redis, from one Redis to
// another (strings to lean-only) and from a Redis onto a Cluster, with no daemon
// serving: keys handed over a second, and the copier's heap at its largest, sampled
// every 10 ms:
// go test -run XXX -bench LiveCopy -benchtime 1x ./internal/engine/redisstore/
func BenchmarkLiveCopy(b *testing.B) {
	const liveCopyRecords = 5000
	fill := func(b *testing.B, s engine.Porter) {
		now := time.Now()
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Go(func() {
				for i := w; i < liveCopyRecords; i += 32 {
					key := fmt.Sprintf("live-copy-%d", i)
					e := engine.Exported{KeyDigest: engine.KeyDigest(key)}
					e.ID = engine.ID{Tenant: engine.DefaultTenant, Key: key}
					e.State, e.Attempt, e.LeaseToken = engine.StateCompleted, 1, engine.NewLeaseToken()
					e.CreatedAt, e.UpdatedAt, e.ExpiresAt = now, now, now.Add(time.Hour)
					e.Response = &engine.Response{Status: 200, Headers: map[string][]string{"Content-Type": {"application/json"}},
						Body: bytes.Repeat([]byte("x"), 200)}
					if _, err := s.Import(context.Background(), e); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
	}
	open := func(b *testing.B, url string, opts redisstore.Options) *redisstore.Store {
		s, err := redisstore.OpenWith(url, opts)
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	run := func(b *testing.B, from engine.Store, to engine.Store) {
		fill(b, from.(engine.Porter))
		m, err := engine.NewMigrator(to, from)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		runtime.GC()
		var base runtime.MemStats
		runtime.ReadMemStats(&base)
		var peak atomic.Uint64
		done := make(chan struct{})
		go func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peak.Load() {
					peak.Store(ms.HeapAlloc)
				}
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		b.ResetTimer()
		p, err := m.CopyAll(ctx, nil)
		b.StopTimer()
		took := time.Since(start)
		close(done)
		if err != nil || !p.Done || p.Moved != liveCopyRecords || p.Failed != 0 {
			b.Fatalf("live copy: %+v, %v", p, err)
		}
		b.ReportMetric(float64(p.Moved)/took.Seconds(), "records/s")
		b.ReportMetric(float64(peak.Load()-min(peak.Load(), base.HeapAlloc))/(1<<20), "MB-heap-growth")
	}
	old := func(b *testing.B, url string) *redisstore.Store {
		// Named as a migrating daemon names its connections to the old store, so that
		// the copier does not wait for them as for a daemon serving it alone.
		return open(b, url, redisstore.Options{ClientName: redisstore.MigratingClientName})
	}
	b.Run("embedded-to-lean", func(b *testing.B) {
		from, err := boltstore.Open(filepath.Join(b.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		run(b, from, open(b, testredis.Start(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
	b.Run("strings-to-lean-only", func(b *testing.B) {
		run(b, old(b, testredis.Start(b).URL()),
			open(b, testredis.Start(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
	b.Run("standalone-to-cluster", func(b *testing.B) {
		run(b, old(b, testredis.Start(b).URL()),
			open(b, testredis.StartCluster(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
}
