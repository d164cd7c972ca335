package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/lintest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	for name, opts := range map[string]redisstore.Options{
		"strings":    {},
		"lean ready": {LeanReady: true},
		"lean":       {LeanRecords: true},
		"lean only":  {LeanRecords: true, LeanOnly: true},
	} {
		t.Run(name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T) engine.Store {
				s, err := redisstore.OpenWith(srv.URL(), opts)
				if err != nil {
					t.Fatal(err)
				}
				return s
			})
		})
	}
}

// BenchmarkClaimComplete runs claim+complete cycles on fresh keys through the store,
// in parallel, and reports the CPU Redis spent per cycle and how many commands it
// processed per read system call, as Redis itself counts them (INFO; the calls a
// script makes count as commands), and the CPU this process (the daemon's side of the
// store) spent per cycle: with the previous release's scripts, with records kept as
// strings (the store's default), while moving to the lean layout (--redis-record-layout
// lean-ready, then lean), in it (lean-only),
// as hashes (--redis-hash-records), and with one pipeline in flight per master as well
// as the default two:
// go test -run XXX -bench ClaimComplete -cpu 32 ./internal/engine/redisstore/
func BenchmarkClaimComplete(b *testing.B) {
	for _, layout := range []struct {
		name    string
		opts    redisstore.Options
		scripts string
	}{
		{"previous-release", redisstore.Options{}, previousScripts},
		{"strings", redisstore.Options{}, ""},
		{"lean-ready", redisstore.Options{LeanReady: true}, ""},
		{"lean", redisstore.Options{LeanRecords: true}, ""},
		{"lean-only", redisstore.Options{LeanRecords: true, LeanOnly: true}, ""},
		{"hashes", redisstore.Options{HashRecords: true}, ""},
		{"strings/pipelines=1", redisstore.Options{Pipelines: 1}, ""},
	} {
		b.Run(layout.name, func(b *testing.B) { claimComplete(b, layout.opts, layout.scripts) })
	}
}

func claimComplete(b *testing.B, opts redisstore.Options, scripts string) {
	srv := testredis.Start(b)
	var s *redisstore.Store
	var err error
	if scripts != "" {
		s, err = redisstore.OpenWithScripts(srv.URL(), opts, scripts)
	} else {
		s, err = redisstore.OpenWith(srv.URL(), opts)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var seq atomic.Int64
	prefix := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	before := redisCounters(b, srv)
	cpuBefore := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			id := engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("%s-%d", prefix, seq.Add(1))}
			c := engine.Claim{ID: id, Lease: 30 * time.Second, Retention: time.Hour, Token: engine.NewLeaseToken()}
			if _, err := s.Claim(ctx, c); err != nil {
				b.Error(err)
				return
			}
			if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
				Response: engine.Response{Status: 200, Body: []byte(`{"order":42}`)}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	after := redisCounters(b, srv)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric((after.cpu-before.cpu)*1e6/float64(b.N), "redis-µs/cycle")
	b.ReportMetric(float64(processCPU(b)-cpuBefore)/1e3/float64(b.N), "go-µs/cycle")
	b.ReportMetric((after.commands-before.commands)/(after.reads-before.reads), "commands/read")
}

// processCPU is the CPU time this process has spent, user and system, in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

type counters struct{ cpu, commands, reads float64 }

// redisCounters reads Redis's own CPU time (user and system, in seconds), the
// commands it processed and the read system calls it made on client connections.
func redisCounters(b *testing.B, srv *testredis.Server) counters {
	b.Helper()
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	info, err := client.Info(context.Background(), "cpu", "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	fields := make(map[string]float64)
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			if n, err := strconv.ParseFloat(v, 64); err == nil {
				fields[k] = n
			}
		}
	}
	return counters{cpu: fields["used_cpu_user"] + fields["used_cpu_sys"],
		commands: fields["total_commands_processed"], reads: fields["total_reads_processed"]}
}

// TestLookupWhenOutOfMemory fills a Redis that refuses writes when full (noeviction):
// claims then fail as unavailable, while lookups, marked no-writes, still answer.
func TestLookupWhenOutOfMemory(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	big := make([]byte, 64<<10)
	var first engine.ID
	var full error
	for i := range 1000 {
		id := engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("oom-%d", i)}
		c := engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			full = err
			break
		}
		if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
			Response: engine.Response{Status: 200, Body: big}}); err != nil {
			full = err
			break
		}
		if i == 0 {
			first = id
		}
	}
	if !errors.Is(full, engine.ErrUnavailable) || !strings.Contains(full.Error(), "OOM") {
		t.Fatalf("filling a 4 MB Redis: %v, want an OOM refusal", full)
	}
	rec, err := s.Lookup(ctx, first)
	if err != nil || rec.State != engine.StateCompleted || len(rec.Response.Body) != len(big) {
		t.Fatalf("lookup on a full Redis: %v %v", rec.State, err)
	}
}

func TestLinearizable(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := lintest.Run(t, s, lintest.Config{Clients: 8, Keys: 6, OpsPerClient: 150})
	if res := h.Check(t, "redis"); res != porcupine.Ok {
		t.Fatalf("%d calls on standalone Redis: %s", len(h.Ops), res)
	}
}

// BenchmarkMemoryPerRecord measures the Redis memory a completed record takes, for
// sizing: used_memory per record over b.N records, and MEMORY USAGE of one. The records
// carry the middleware's default stored headers (content-type, location) and bodies of 0,
// 100 and 1024 bytes, in two shapes: "key40", a 40-byte key and a 32-digit hex
// fingerprint; "middleware", a key, a fingerprint and a claim secret as the
// Idempotency-Key middlewares send them. The layouts: strings (the store's default), lean
// (--redis-record-layout lean), and hashes (--redis-hash-records) with Redis's default
// hash-max-listpack-value (64) and with 2048, which keeps hashes in the compact listpack
// encoding:
//
//	go test -run XXX -bench MemoryPerRecord -benchtime 20000x ./internal/engine/redisstore/
func BenchmarkMemoryPerRecord(b *testing.B) {
	for _, layout := range []struct {
		name   string
		opts   redisstore.Options
		config []string
	}{
		{"strings", redisstore.Options{}, nil},
		{"lean", redisstore.Options{LeanRecords: true}, nil},
		{"hashes/listpack-value=64", redisstore.Options{HashRecords: true}, []string{"--hash-max-listpack-value", "64"}},
		{"hashes/listpack-value=2048", redisstore.Options{HashRecords: true}, []string{"--hash-max-listpack-value", "2048"}},
	} {
		for _, shape := range []string{"key40", "middleware"} {
			for _, size := range []int{0, 100, 1024} {
				b.Run(fmt.Sprintf("%s/%s/body=%d", layout.name, shape, size), func(b *testing.B) {
					memoryPerRecord(b, shape, size, layout.opts, layout.config...)
				})
			}
		}
	}
}

func memoryPerRecord(b *testing.B, shape string, size int, opts redisstore.Options, config ...string) {
	srv := testredis.Start(b, config...)
	s, err := redisstore.OpenWith(srv.URL(), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	used := func() int64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		b.Fatal("no used_memory in INFO memory")
		return 0
	}
	body := make([]byte, size)
	headers := map[string][]string{"content-type": {"application/json"}, "location": {"/orders/0123456789"}}
	record := func(i int) engine.Claim {
		if shape == "middleware" {
			sum := sha256.Sum256([]byte(strconv.Itoa(i)))
			digest := hex.EncodeToString(sum[:])
			return engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: "idempotency-key:v1:" + digest},
				Fingerprint: "sha256:" + digest, Secret: digest, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
		}
		return engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("order-%034d", i)},
			Fingerprint: "0123456789abcdef0123456789abcdef", Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	}
	before := used()
	b.ResetTimer()
	var last engine.ID
	for i := range b.N {
		c := record(i)
		if _, err := s.Claim(ctx, c); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Complete(ctx, engine.Completion{ID: c.ID, LeaseToken: c.Token, Retention: time.Hour,
			Response: engine.Response{Status: 201, Headers: headers, Body: body}}); err != nil {
			b.Fatal(err)
		}
		last = c.ID
	}
	b.StopTimer()
	b.ReportMetric(float64(used()-before)/float64(b.N), "bytes/record")
	key := redisstore.RecordKey(last)
	if opts.LeanRecords {
		key = redisstore.LeanKey(last)
	}
	usage, err := client.MemoryUsage(ctx, key).Result()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(usage), "memory-usage-bytes")
}

// TestSentinel runs the conformance suite through Sentinel, with and without a
// replica acknowledging every write.
func TestSentinel(t *testing.T) {
	t.Parallel()
	s := testredis.StartSentinel(t)
	for name, opts := range map[string]redisstore.Options{
		"plain":             {},
		"one replica acked": {ReplicaAcks: 1, ReplicaTimeout: 2 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T) engine.Store {
				st, err := redisstore.OpenWith(s.URL(), opts)
				if err != nil {
					t.Fatal(err)
				}
				return st
			})
		})
	}
}

// TestSentinelFailover kills the master under a store opened through Sentinel: calls
// fail as unavailable until Sentinel promotes the replica, then work again without
// reopening the store, and a completion made before the kill is still there.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	sen := testredis.StartSentinel(t)
	s, err := redisstore.Open(sen.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "before-failover"}
	c := engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	if _, err := s.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
		Response: engine.Response{Status: 200, Body: []byte("kept")}}); err != nil {
		t.Fatal(err)
	}
	// Let the replica catch up, as a replica acknowledgement would have ensured. WAIT
	// on a connection of its own would count only that connection's writes, none.
	// Instead a marker is written after the completion: the replica applies the
	// master's writes in order, so once it holds the marker it holds the completion.
	marker := engine.ID{Tenant: engine.DefaultTenant, Key: "replicated"}
	if _, err := s.Claim(ctx, engine.Claim{ID: marker, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the replica to hold the writes before the failover", func() bool {
		reply, err := sen.Replica.Command("EXISTS", redisstore.RecordKey(marker), redisstore.LeanKey(marker))
		return err == nil && reply == ":1"
	})
	sen.Master.Stop()

	sawUnavailable := false
	i := 0
	wait.For(t, 60*time.Second, "a claim to succeed after the master was killed", func() bool {
		i++
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := s.Claim(cctx, engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("after-%d", i)},
			Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
		// A call that outlives its own context returns that context's error: the
		// caller's deadline, which the daemon's service turns into a store timeout.
		if err != nil && !errors.Is(err, engine.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("claim during the failover: %v, want unavailable or the call's deadline", err)
		}
		sawUnavailable = sawUnavailable || err != nil
		return err == nil
	})
	if !sawUnavailable {
		t.Fatal("no call failed while the master was down")
	}
	rec, err := s.Lookup(ctx, id)
	if err != nil || rec.State != engine.StateCompleted || string(rec.Response.Body) != "kept" {
		t.Fatalf("the record completed before the failover: %+v %v", rec, err)
	}
}

// TestWatchAfterClose: a closed store starts no new pub/sub connection (and no
// goroutine to read it) for a late waiter; the waiter hears that the store is closed.
func TestWatchAfterClose(t *testing.T) {
	srv := testredis.Start(t)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "late"}
	w, err := s.Watch(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	w, err = s.Watch(t.Context(), id)
	if err == nil {
		w.Close()
		t.Fatal("Watch on a closed store succeeded")
	}
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Watch on a closed store: %v, want unavailable", err)
	}
}

// tracingClient is a Client of the kind an application wraps around go-redis, here
// counting the masters it hands out.
type tracingClient struct {
	redisstore.Client
	masters atomic.Int64
}

func (c *tracingClient) MasterFor(ctx context.Context, key string) (*redis.Client, error) {
	c.masters.Add(1)
	return c.Client.MasterFor(ctx, key)
}

// TestWrappedClientWithReplicaAcks: a client wrapped by the application serves
// replica acknowledgements (and everything else) through the Client interface; the
// store used to switch on go-redis's concrete types and fail at run time on anything
// else.
func TestWrappedClientWithReplicaAcks(t *testing.T) {
	master := testredis.Start(t)
	testredis.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	wait.For(t, 10*time.Second, "the replica to attach", func() bool {
		reply, err := master.Command("WAIT", "1", "100")
		return err == nil && reply == ":1"
	})
	for _, tc := range []struct {
		acks    int
		wantErr error
	}{{1, nil}, {2, engine.ErrNotReplicated}} {
		universal, err := redisstore.NewClient(master.URL())
		if err != nil {
			t.Fatal(err)
		}
		adapted, err := redisstore.Adapt(universal)
		if err != nil {
			t.Fatal(err)
		}
		client := &tracingClient{Client: adapted}
		s := redisstore.New(client, redisstore.Options{ReplicaAcks: tc.acks, ReplicaTimeout: 2 * time.Second})
		id := engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("wrapped-%d", tc.acks)}
		_, err = s.Claim(t.Context(), engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Errorf("claim with %d replica acks: %v, want %v", tc.acks, err, tc.wantErr)
		}
		if client.masters.Load() == 0 {
			t.Errorf("with %d replica acks the store did not ask the wrapped client for the master", tc.acks)
		}
		if bad, err := s.EvictionPolicies(t.Context()); err != nil || len(bad) != 0 {
			t.Errorf("eviction policies through the wrapped client: %v %v", bad, err)
		}
		_ = s.Close()
	}
}
