package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// twoDaemons starts two daemons, each with its own connections, over one Redis: the
// deployment of several replicas behind a load balancer.
func twoDaemons(t *testing.T) (a, b *daemon) {
	t.Helper()
	r := testredis.Start(t)
	for _, d := range []**daemon{&a, &b} {
		store, err := redisstore.Open(r.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		*d = newDaemon(t, store)
	}
	return a, b
}

// TestWaitWakesAcrossDaemons has a claim wait on one daemon while the holder completes
// through another. The waiter must be woken by the store's notification: the daemons
// of these tests never re-read the record on their own within a wait, so a waiter
// that missed it would answer 409 when its wait ran out.
func TestWaitWakesAcrossDaemons(t *testing.T) {
	t.Parallel()
	a, b := twoDaemons(t)
	for _, end := range []string{"complete", "fail", "retry"} {
		t.Run(end, func(t *testing.T) {
			key := freshKey("across-" + end)
			tok := b.acquire(key, "lease_ms", 60000)
			waited := make(chan answer, 1)
			go func() { waited <- a.claim(map[string]any{"key": key, "wait_ms": 30000}) }()
			waitForMetric(t, a, "idemd_claim_waiters 1")

			var ended answer
			switch end {
			case "complete":
				ended = b.complete(key, tok, 201, []byte(`{"id":1}`))
			case "fail":
				ended = b.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "fail",
					"response": map[string]any{"status": 402, "body": []byte("declined")}})
			case "retry":
				ended = b.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "retry"})
			}
			if ended.status != http.StatusOK {
				t.Fatalf("%s through the second daemon: %d %s", end, ended.status, ended.raw)
			}
			got := <-waited

			want := map[string]struct {
				status  int
				outcome string
			}{
				"complete": {200, "completed"},
				"fail":     {200, "failed"},
				"retry":    {201, "acquired"},
			}[end]
			if got.status != want.status || got.str("outcome") != want.outcome {
				t.Fatalf("waiter: %d %s, want %d %s", got.status, got.raw, want.status, want.outcome)
			}
		})
	}
}

// BenchmarkWakeAcrossDaemons measures how long a waiting claim on one daemon takes to
// answer after the holder completes through another daemon over the same Redis:
//
//	go test -run XXX -bench WakeAcrossDaemons -benchtime 200x ./internal/server/
func BenchmarkWakeAcrossDaemons(b *testing.B) {
	r := testredis.Start(b)
	var ds [2]*daemon
	for i := range ds {
		store, err := redisstore.Open(r.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		ds[i] = newDaemon(b, store)
	}
	var worst, total time.Duration
	for b.Loop() {
		key := freshKey("wake-bench")
		tok := ds[1].acquire(key, "lease_ms", 20000)
		waited := make(chan answer, 1)
		go func() { waited <- ds[0].claim(map[string]any{"key": key, "wait_ms": 10000}) }()
		waitForMetric(b, ds[0], "idemd_claim_waiters 1")
		start := time.Now()
		ds[1].complete(key, tok, 201, []byte("done"))
		got := <-waited
		took := time.Since(start)
		if got.status != http.StatusOK {
			b.Fatalf("waiter: %d %s", got.status, got.raw)
		}
		total += took
		worst = max(worst, took)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "wake-ms")
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-wake-ms")
}
