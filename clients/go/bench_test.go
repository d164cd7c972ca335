package idem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
)

// BenchmarkMiddleware measures what idem.Middleware costs the service's own process,
// against the shared daemon, with 50 concurrent callers as cmd/idemd-appbench has:
// first requests (fresh keys) and replays of them. The handler and the requests are
// in process, so that what is measured is the middleware and the client: cpu-µs/op is
// this process's user and system time per request (the daemon is another process),
// next to the allocations per request. Each is measured with a plain client and with a
// sealing one (WithSealing), in the same run, so that the cost of sealing is their ratio.
func BenchmarkMiddleware(b *testing.B) {
	ring, err := idem.NewKeyRing(idem.SealKey{ID: "k-bench", Key: make([]byte, 32)})
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range []struct {
		name string
		opts []idem.Option
	}{{"plain", nil}, {"sealed", []idem.Option{idem.WithSealing("bench", ring)}}} {
		c, err := idem.New(daemonURL, v.opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(v.name, func(b *testing.B) { benchmarkMiddleware(b, c) })
	}
}

func benchmarkMiddleware(b *testing.B, c *idem.Client) {
	var runs atomic.Int64
	h := idem.Middleware(c, idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))(
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			id := runs.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/orders/"+strconv.FormatInt(id, 10))
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%d,"amount":1250}`, id)
		}))
	prefix := freshKey("bench")
	var seq atomic.Int64
	serve := func(b *testing.B, key int64) {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"amount": 1250, "currency": "EUR"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "user-"+strconv.FormatInt(key%100, 10))
		req.Header.Set(idem.HeaderIdempotencyKey, prefix+"-"+strconv.FormatInt(key, 10))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			b.Fatalf("answered %d: %s", w.Code, w.Body)
		}
	}
	measure := func(b *testing.B, next func() int64) {
		b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
		b.ReportAllocs()
		before := cpuTime()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				serve(b, next())
			}
		})
		b.StopTimer()
		b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	}
	b.Run("first", func(b *testing.B) {
		measure(b, func() int64 { return seq.Add(1) })
	})
	b.Run("replay", func(b *testing.B) {
		// The first requests of the keys replayed, made before the measure.
		first := seq.Load() + 1
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				serve(b, seq.Add(1))
			}
		})
		var replayed atomic.Int64
		measure(b, func() int64 { return first + (replayed.Add(1)-1)%int64(b.N) })
	})
}

// cpuTime is the user and system time this process has spent.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
