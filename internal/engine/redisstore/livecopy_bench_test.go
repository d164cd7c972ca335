package redisstore_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// liveCopyRecords is how many records BenchmarkLiveCopy moves.
var liveCopyRecords = flag.Int("livecopy.records", 5000, "records BenchmarkLiveCopy moves")

// redisCost is the CPU seconds the redis-servers at addrs have used, the scripts
// (EVALSHA and EVAL) they have run and the seconds they spent running them, summed.
func redisCost(b *testing.B, addrs []string) (cpu, scripts, inScripts float64) {
	ctx := context.Background()
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		text, err := c.Info(ctx, "cpu", "commandstats").Result()
		_ = c.Close()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(text) {
			name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			switch name {
			case "used_cpu_user", "used_cpu_sys":
				f, _ := strconv.ParseFloat(v, 64)
				cpu += f
			case "cmdstat_evalsha", "cmdstat_eval":
				for _, f := range strings.Split(v, ",") {
					n, v, _ := strings.Cut(f, "=")
					x, _ := strconv.ParseFloat(v, 64)
					switch n {
					case "calls":
						scripts += x
					case "usec":
						inScripts += x / 1e6
					}
				}
			}
		}
	}
	return cpu, scripts, inScripts
}

// ownCPU is the CPU seconds this process has used.
func ownCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// BenchmarkLiveCopy measures the copier of a live move (Migrator.CopyAll, which a
// daemon started with --migrate-from runs) on -livecopy.records completed records (a
// 200-byte response each, 5,000 unless told), from the embedded store into a lean Redis,
// from one Redis to another (strings to lean-only) and from a Redis onto a 3-master
// Cluster, with no daemon serving: keys handed over a second, the copier's heap at its
// largest (sampled every 10 ms) and its CPU per key, and per key the CPU, the scripts
// (EVALSHA, EVAL) and the time spent in them of the old Redis and of the new one (every
// master of a Cluster summed, INFO cpu and commandstats):
// go test -run XXX -bench LiveCopy -benchtime 1x ./internal/engine/redisstore/ -args -livecopy.records 200000
func BenchmarkLiveCopy(b *testing.B) {
	records := *liveCopyRecords
	fill := func(b *testing.B, s engine.Porter) {
		now := time.Now()
		var wg sync.WaitGroup
		for w := range 128 {
			wg.Go(func() {
				for i := w; i < records; i += 128 {
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
	// run moves every record from from to to; oldAddrs and newAddrs are the Redis
	// masters of each (none for the embedded store).
	run := func(b *testing.B, from engine.Store, oldAddrs []string, to engine.Store, newAddrs []string) {
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
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		oldCPU, oldScripts, oldIn := redisCost(b, oldAddrs)
		newCPU, newScripts, newIn := redisCost(b, newAddrs)
		own := ownCPU()
		start := time.Now()
		b.ResetTimer()
		p, err := m.CopyAll(ctx, nil)
		b.StopTimer()
		took := time.Since(start)
		close(done)
		if err != nil || !p.Done || p.Moved != int64(records) || p.Failed != 0 {
			b.Fatalf("live copy: %+v, %v", p, err)
		}
		n := float64(p.Moved)
		own = ownCPU() - own
		oldCPU2, oldScripts2, oldIn2 := redisCost(b, oldAddrs)
		newCPU2, newScripts2, newIn2 := redisCost(b, newAddrs)
		b.ReportMetric(n/took.Seconds(), "records/s")
		b.ReportMetric(float64(peak.Load()-min(peak.Load(), base.HeapAlloc))/(1<<20), "MB-heap-growth")
		b.ReportMetric(own*1e6/n, "copier-µs/key")
		if len(oldAddrs) > 0 {
			b.ReportMetric((oldCPU2-oldCPU)*1e6/n, "old-redis-µs/key")
			b.ReportMetric((oldScripts2-oldScripts)/n, "old-scripts/key")
			b.ReportMetric((oldIn2-oldIn)*1e6/n, "old-in-scripts-µs/key")
		}
		b.ReportMetric((newCPU2-newCPU)*1e6/n, "new-redis-µs/key")
		b.ReportMetric((newScripts2-newScripts)/n, "new-scripts/key")
		b.ReportMetric((newIn2-newIn)*1e6/n, "new-in-scripts-µs/key")
	}
	old := func(b *testing.B, url string) *redisstore.Store {
		// Named as a migrating daemon names its connections to the old store, so that
		// the copier does not wait for them as for a daemon serving it alone.
		return open(b, url, redisstore.Options{ClientName: redisstore.MigratingClientName})
	}
	masters := func(c *testredis.Cluster) []string {
		var out []string
		for _, m := range c.Masters() {
			out = append(out, m.Addr())
		}
		return out
	}
	b.Run("embedded-to-lean", func(b *testing.B) {
		from, err := boltstore.Open(filepath.Join(b.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		to := testredis.Start(b)
		run(b, from, nil, open(b, to.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}), []string{to.Addr()})
	})
	b.Run("strings-to-lean-only", func(b *testing.B) {
		from, to := testredis.Start(b), testredis.Start(b)
		run(b, old(b, from.URL()), []string{from.Addr()},
			open(b, to.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}), []string{to.Addr()})
	})
	b.Run("standalone-to-cluster", func(b *testing.B) {
		from, to := testredis.Start(b), testredis.StartCluster(b)
		run(b, old(b, from.URL()), []string{from.Addr()},
			open(b, to.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}), masters(to))
	})
}
