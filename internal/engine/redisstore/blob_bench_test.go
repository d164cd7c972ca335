package redisstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// blobService is a Service over a fresh Redis, with a blob directory when threshold is
// positive, and a client to read Redis's memory.
func blobService(b *testing.B, threshold int) (*engine.Service, *redis.Client) {
	b.Helper()
	srv := testredis.Start(b)
	store, err := redisstore.Open(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	var opts []engine.Option
	if threshold > 0 {
		dir, err := blobdir.Open(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		opts = append(opts, engine.WithBlobs(dir, engine.BlobOptions{Threshold: threshold}))
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { _ = c.Close() })
	return engine.NewService(store, time.Hour, opts...), c
}

func usedMemory(b *testing.B, c *redis.Client) int64 {
	b.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
}

// completeLarge claims key and completes it with body, and returns the claim that
// replays it.
func completeLarge(b *testing.B, s *engine.Service, key string, body []byte) {
	b.Helper()
	ctx := context.Background()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: key}
	res, err := s.Claim(ctx, engine.ClaimRequest{ID: id, Fingerprint: "fp"})
	if err != nil {
		b.Fatal(err)
	}
	resp := engine.Response{Status: 200, Headers: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: body}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: res.Record.LeaseToken, Response: resp}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBlobRedisMemory measures Redis's memory per completed record whose result
// is 1 MiB, kept inline or by reference in a blob directory (docs/benchmarks.md,
// "Large results"):
//
//	go test -run '^$' -bench BlobRedisMemory -benchtime 50x ./internal/engine/redisstore
func BenchmarkBlobRedisMemory(b *testing.B) {
	body := make([]byte, 1<<20)
	_, _ = rand.Read(body)
	for _, c := range []struct {
		name      string
		threshold int
	}{{"inline", 0}, {"reference", engine.DefaultBlobThreshold}} {
		b.Run(c.name, func(b *testing.B) {
			s, client := blobService(b, c.threshold)
			before := usedMemory(b, client)
			b.ResetTimer()
			for i := range b.N {
				completeLarge(b, s, fmt.Sprintf("memory-%08d", i), body)
			}
			b.StopTimer()
			b.ReportMetric(float64(usedMemory(b, client)-before)/float64(b.N), "redis-bytes/record")
		})
	}
}

// BenchmarkBlobThreshold completes and replays results of several sizes, inline and
// by reference in a blob directory, over Redis: where the reference starts to cost
// less than carrying the bytes through Redis is where the threshold belongs.
//
//	go test -run '^$' -bench BlobThreshold -benchtime 200x ./internal/engine/redisstore
func BenchmarkBlobThreshold(b *testing.B) {
	for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		body := bytes.Repeat([]byte{'x'}, size)
		for _, c := range []struct {
			name      string
			threshold int
		}{{"inline", 0}, {"reference", 1}} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, c.name), func(b *testing.B) {
				s, _ := blobService(b, c.threshold)
				ctx := context.Background()
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					key := fmt.Sprintf("t-%08d", i)
					completeLarge(b, s, key, body)
					res, err := s.Claim(ctx, engine.ClaimRequest{ID: engine.ID{Tenant: engine.DefaultTenant, Key: key}, Fingerprint: "fp"})
					if err != nil || len(res.Record.Response.Body) != size {
						b.Fatalf("replay: %v", err)
					}
				}
			})
		}
	}
}
