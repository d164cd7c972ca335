package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/lintest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testredis"
	"github.com/idemd/idemd/internal/wait"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	enginetest.Run(t, func(t *testing.T) engine.Store {
		s, err := redisstore.Open(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// BenchmarkClaimComplete runs claim+complete cycles on fresh keys through the store,
// in parallel: go test -run XXX -bench ClaimComplete -cpu 32 ./internal/engine/redisstore/
func BenchmarkClaimComplete(b *testing.B) {
	srv := testredis.Start(b)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var seq atomic.Int64
	prefix := fmt.Sprintf("bench-%d", time.Now().UnixNano())
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
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
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

// BenchmarkMemoryPerRecord measures the Redis memory a completed record takes, with a
// 40-byte key, two response headers and bodies of 0, 100 and 1024 bytes, for sizing;
// with Redis's default hash-max-listpack-value (64) and with 2048, which keeps records
// in the compact listpack encoding:
//
//	go test -run XXX -bench MemoryPerRecord -benchtime 20000x ./internal/engine/redisstore/
func BenchmarkMemoryPerRecord(b *testing.B) {
	for _, listpack := range []string{"64", "2048"} {
		for _, size := range []int{0, 100, 1024} {
			b.Run(fmt.Sprintf("listpack-value=%s/body=%d", listpack, size), func(b *testing.B) {
				memoryPerRecord(b, size, "--hash-max-listpack-value", listpack)
			})
		}
	}
}

func memoryPerRecord(b *testing.B, size int, config ...string) {
	srv := testredis.Start(b, config...)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	used := func() int64 {
		client, err := redisstore.NewClient(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer client.Close()
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
	headers := map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/0123456789"}}
	before := used()
	b.ResetTimer()
	for i := range b.N {
		id := engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("order-%034d", i)}
		c := engine.Claim{ID: id, Fingerprint: "0123456789abcdef0123456789abcdef", Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
			Response: engine.Response{Status: 201, Headers: headers, Body: body}}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(used()-before)/float64(b.N), "bytes/record")
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
	// Let the replica catch up, as a replica acknowledgement would have ensured.
	if reply, err := sen.Master.Command("WAIT", "1", "5000"); err != nil || reply != ":1" {
		t.Fatalf("WAIT: %q %v", reply, err)
	}
	sen.Master.Stop()

	sawUnavailable := false
	i := 0
	wait.For(t, 60*time.Second, "a claim to succeed after the master was killed", func() bool {
		i++
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := s.Claim(cctx, engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("after-%d", i)},
			Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
		if err != nil && !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("claim during the failover: %v, want unavailable", err)
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
