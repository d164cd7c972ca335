package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/lintest"
	"github.com/idemd/idemd/internal/testing/wait"
)

func open(t testing.TB, path string, opts boltstore.Options) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	enginetest.Run(t, func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{SweepInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// clock is a settable clock for the store.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), wait.Scale(10*time.Second))
	t.Cleanup(cancel)
	return c
}

func id(key string) engine.ID { return engine.ID{Tenant: engine.DefaultTenant, Key: key} }

func claimAndComplete(t *testing.T, s *boltstore.Store, key string, retention time.Duration) {
	t.Helper()
	c := engine.Claim{ID: id(key), Lease: time.Minute, Retention: retention, Token: engine.NewLeaseToken()}
	if res, err := s.Claim(ctx(t), c); err != nil || res.Outcome != engine.OutcomeAcquired {
		t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
	}
	if _, err := s.Complete(ctx(t), engine.Completion{ID: c.ID, LeaseToken: c.Token, Retention: retention,
		Response: engine.Response{Status: 200, Body: []byte(key)}}); err != nil {
		t.Fatalf("complete %s: %v", key, err)
	}
}

func recordsGauge(t *testing.T, s *boltstore.Store, state string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "idemd_records" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == state {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no idemd_records{state=%q}", state)
	return 0
}

// TestExpiredIsAbsentBeforeSweep moves the store's clock past a record's retention with
// the sweeper idle: the record must already be gone for every transition.
func TestExpiredIsAbsentBeforeSweep(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{Now: clk.Now, SweepInterval: time.Hour})
	claimAndComplete(t, s, "old", time.Minute)
	clk.advance(time.Minute)
	if _, err := s.Lookup(ctx(t), id("old")); err != nil {
		t.Fatalf("at exactly its expiry the record is still there: %v", err)
	}
	clk.advance(time.Millisecond)
	if _, err := s.Lookup(ctx(t), id("old")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("lookup past retention: %v, want not found", err)
	}
	if err := s.Purge(ctx(t), id("old")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("purge past retention: %v, want not found", err)
	}
	res, err := s.Claim(ctx(t), engine.Claim{ID: id("old"), Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
	if err != nil || res.Outcome != engine.OutcomeAcquired || res.Record.Attempt != 1 {
		t.Fatalf("claim past retention: %v attempt %d %v, want a fresh acquisition", res.Outcome, res.Record.Attempt, err)
	}
}

// TestSweeper fills the store with records of two retentions, moves the clock past the
// shorter one and sweeps: exactly the short-lived records go, in several small
// transactions, and the counts follow.
func TestSweeper(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{Now: clk.Now, SweepInterval: time.Hour, SweepBatch: 7})
	const short, long = 40, 15
	for i := range short {
		claimAndComplete(t, s, fmt.Sprintf("short-%d", i), time.Minute)
	}
	for i := range long {
		claimAndComplete(t, s, fmt.Sprintf("long-%d", i), time.Hour)
	}
	if got := recordsGauge(t, s, "completed"); got != short+long {
		t.Fatalf("idemd_records{state=completed} %v, want %d", got, short+long)
	}
	if n, err := s.Sweep(); err != nil || n != 0 {
		t.Fatalf("sweep before anything expired removed %d (%v)", n, err)
	}
	clk.advance(2 * time.Minute)
	n, err := s.Sweep()
	if err != nil || n != short {
		t.Fatalf("sweep removed %d (%v), want %d", n, err, short)
	}
	for i := range long {
		if _, err := s.Lookup(ctx(t), id(fmt.Sprintf("long-%d", i))); err != nil {
			t.Fatalf("long-lived record %d: %v", i, err)
		}
	}
	if got := recordsGauge(t, s, "completed"); got != long {
		t.Fatalf("idemd_records{state=completed} %v after the sweep, want %d", got, long)
	}
	if got := testutil.ToFloat64(sweptCounter(t, s)); got != short {
		t.Fatalf("idemd_bolt_swept_records_total %v, want %d", got, short)
	}
}

func sweptCounter(t *testing.T, s *boltstore.Store) prometheus.Collector {
	t.Helper()
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		all := make(chan prometheus.Metric, 16)
		s.Collect(all)
		close(all)
		for m := range all {
			if strings.Contains(m.Desc().String(), "idemd_bolt_swept_records_total") {
				ch <- m
			}
		}
	})
}

// TestSweeperRunsByItself lets the background sweeper find an expired record.
func TestSweeperRunsByItself(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{Now: clk.Now, SweepInterval: 10 * time.Millisecond})
	claimAndComplete(t, s, "gone", time.Second)
	clk.advance(2 * time.Second)
	wait.For(t, 10*time.Second, "the sweeper to remove the expired record", func() bool { return recordsGauge(t, s, "completed") == 0 })
}

// TestSecondOpenIsRefused opens a database twice: the second open must fail with a
// clear message after the lock timeout instead of hanging.
func TestSecondOpenIsRefused(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idemd.db")
	open(t, path, boltstore.Options{})
	_, err := boltstore.Open(path, boltstore.Options{LockTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v, want a lock error", err)
	}
}

func TestUnwritableDirectoryIsRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		// root writes anywhere; a path under a regular file cannot be created by anyone.
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := boltstore.Open(filepath.Join(file, "data", "idemd.db"), boltstore.Options{}); err == nil ||
			!strings.Contains(err.Error(), "data directory") {
			t.Fatalf("open under a file: %v, want a data directory error", err)
		}
		return
	}
	dir := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	if _, err := boltstore.Open(filepath.Join(dir, "idemd.db"), boltstore.Options{}); err == nil ||
		!strings.Contains(err.Error(), "not writable") {
		t.Fatalf("open in a read-only directory: %v, want not writable", err)
	}
}

// TestCountsSurviveReopen checks that the records by state are counted again from the
// file when the store opens.
func TestCountsSurviveReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idemd.db")
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	claimAndComplete(t, s, "a", time.Hour)
	claimAndComplete(t, s, "b", time.Hour)
	if _, err := s.Claim(ctx(t), engine.Claim{ID: id("c"), Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, boltstore.Options{})
	if c, p := recordsGauge(t, s, "completed"), recordsGauge(t, s, "pending"); c != 2 || p != 1 {
		t.Fatalf("after reopening: %v completed, %v pending; want 2 and 1", c, p)
	}
}

// TestPingFailsWhenClosed checks that Ping reports a database it cannot write to.
func TestPingFailsWhenClosed(t *testing.T) {
	t.Parallel()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx(t)); err != nil {
		t.Fatalf("ping: %v", err)
	}
	_ = s.Close()
	if err := s.Ping(ctx(t)); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("ping after close: %v, want unavailable", err)
	}
}

// BenchmarkClaimComplete runs durable claim+complete cycles on fresh keys, in parallel:
// go test -run XXX -bench ClaimComplete -cpu 32 ./internal/engine/boltstore/
func BenchmarkClaimComplete(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "idemd.db"), boltstore.Options{})
	var seq atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key := id(fmt.Sprintf("bench-%d", seq.Add(1)))
			c := engine.Claim{ID: key, Lease: 30 * time.Second, Retention: time.Hour, Token: engine.NewLeaseToken()}
			if _, err := s.Claim(ctx, c); err != nil {
				b.Error(err)
				return
			}
			if _, err := s.Complete(ctx, engine.Completion{ID: key, LeaseToken: c.Token, Retention: time.Hour,
				Response: engine.Response{Status: 200, Body: []byte(`{"order":42}`)}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

func TestLinearizable(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	h := lintest.Run(t, s, lintest.Config{Clients: 8, Keys: 6, OpsPerClient: 150})
	if res := h.Check(t, "bolt"); res != porcupine.Ok {
		t.Fatalf("%d calls on the embedded store: %s", len(h.Ops), res)
	}
}

func TestPort(t *testing.T) {
	newStore := func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	enginetest.RunPort(t, newStore, newStore)
}

// TestMoveLive moves records from one embedded store to another while daemons of both
// serve (enginetest.RunMove).
func TestMoveLive(t *testing.T) {
	t.Parallel()
	newStore := func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	enginetest.RunMove(t, newStore, newStore)
}

// TestMoveBatch holds the copier's batch steps between two embedded stores to each
// key's step alone (enginetest.RunMoveBatch).
func TestMoveBatch(t *testing.T) {
	t.Parallel()
	newStore := func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	enginetest.RunMoveBatch(t, newStore, newStore)
}
