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
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// TestPort moves records between every layout, to and from the embedded store, and
// onto a Cluster.
func TestPort(t *testing.T) {
	t.Parallel()
	from, to := testredis.Start(t), testredis.Start(t)
	redisStore := func(url string, opts redisstore.Options) enginetest.NewStore {
		return func(t *testing.T) engine.Store {
			s, err := redisstore.OpenWith(url, opts)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	bolt := func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	layouts := []struct {
		name string
		opts redisstore.Options
	}{
		{"hashes", redisstore.Options{HashRecords: true}},
		{"strings", redisstore.Options{}},
		{"lean", redisstore.Options{LeanRecords: true}},
		{"lean-only", redisstore.Options{LeanRecords: true, LeanOnly: true}},
	}
	for _, a := range layouts {
		for _, b := range layouts {
			t.Run(a.name+" to "+b.name, func(t *testing.T) {
				enginetest.RunPort(t, redisStore(from.URL(), a.opts), redisStore(to.URL(), b.opts))
			})
		}
	}
	t.Run("embedded to lean", func(t *testing.T) {
		enginetest.RunPort(t, bolt, redisStore(to.URL(), redisstore.Options{LeanRecords: true}))
	})
	t.Run("lean-only to embedded", func(t *testing.T) {
		enginetest.RunPort(t, redisStore(from.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}), bolt)
	})
	t.Run("strings to Cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster takes long to start")
		}
		cluster := testredis.StartCluster(t)
		enginetest.RunPort(t, redisStore(from.URL(), redisstore.Options{}), redisStore(cluster.URL(), redisstore.Options{LeanRecords: true}))
	})
}

// BenchmarkCopy measures engine.Copy of copyRecords completed records (a 200-byte
// response each) from the embedded store into a lean Redis, from one Redis to another
// (strings to lean-only) and from a Redis onto a Cluster: records a second, and the
// copier's heap at its largest, sampled every 10 ms:
// go test -run XXX -bench Copy -benchtime 1x ./internal/engine/redisstore/
func BenchmarkCopy(b *testing.B) {
	const copyRecords = 50000
	fill := func(b *testing.B, s engine.Porter) {
		now := time.Now()
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < copyRecords; i += 32 {
					e := engine.Exported{KeyDigest: engine.KeyDigest(fmt.Sprintf("copy-%d", i))}
					e.ID = engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("copy-%d", i)}
					e.State, e.Attempt, e.LeaseToken = engine.StateCompleted, 1, engine.NewLeaseToken()
					e.CreatedAt, e.UpdatedAt, e.ExpiresAt = now, now, now.Add(time.Hour)
					e.Response = &engine.Response{Status: 200, Headers: map[string][]string{"Content-Type": {"application/json"}},
						Body: bytes.Repeat([]byte("x"), 200)}
					if _, err := s.Import(context.Background(), e); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	open := func(b *testing.B, url string, opts redisstore.Options) *redisstore.Store {
		s, err := redisstore.OpenWith(url, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		return s
	}
	run := func(b *testing.B, from, to engine.Porter) {
		fill(b, from)
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
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapAlloc > peak.Load() {
					peak.Store(m.HeapAlloc)
				}
			}
		}()
		b.ResetTimer()
		p, err := engine.Copy(context.Background(), from, to, time.Hour, nil)
		b.StopTimer()
		close(done)
		if err != nil || p.Written != copyRecords {
			b.Fatalf("copy: %+v, %v", p, err)
		}
		b.ReportMetric(p.Rate(), "records/s")
		b.ReportMetric(float64(peak.Load()-min(peak.Load(), base.HeapAlloc))/(1<<20), "MB-heap-growth")
	}
	b.Run("embedded-to-lean", func(b *testing.B) {
		from, err := boltstore.Open(filepath.Join(b.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = from.Close() })
		run(b, from, open(b, testredis.Start(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
	b.Run("strings-to-lean-only", func(b *testing.B) {
		run(b, open(b, testredis.Start(b).URL(), redisstore.Options{}),
			open(b, testredis.Start(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
	b.Run("standalone-to-cluster", func(b *testing.B) {
		run(b, open(b, testredis.Start(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}),
			open(b, testredis.StartCluster(b).URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
}
