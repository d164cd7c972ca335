package loadgen

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers claims and completes as idemd would, counting the claims; a
// claim past block waits until its client gives up.
func echoServer(t *testing.T, claims *atomic.Int64, block int64) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/claim", func(w http.ResponseWriter, r *http.Request) {
		// Read to the end, so that the server notices the client hanging up.
		_, _ = io.Copy(io.Discard, r.Body)
		if n := claims.Add(1); block > 0 && n > block {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"outcome": "acquired", "lease_token": "t"})
	})
	mux.HandleFunc("POST /v1/complete", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	// Cleanups run last first: the blocked claims end before Close waits for them.
	t.Cleanup(func() { close(release) })
	return s
}

// TestCyclesByURL: clients shared out among several servers send their cycles there,
// and the result says how many went to each.
func TestCyclesByURL(t *testing.T) {
	var a, b atomic.Int64
	sa, sb := echoServer(t, &a, 0), echoServer(t, &b, 0)
	res, err := Run(context.Background(), Config{BaseURLs: []string{sa.URL, sb.URL}, Clients: 4, Cycles: 40, KeyPrefix: "by-url"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 40 || res.Errors != 0 {
		t.Fatalf("%d cycles, %d errors; want 40 and 0", res.Cycles, res.Errors)
	}
	if len(res.CyclesByURL) != 2 || int64(res.CyclesByURL[0]) != a.Load() || int64(res.CyclesByURL[1]) != b.Load() {
		t.Fatalf("cycles by URL %v, the servers counted %d and %d claims", res.CyclesByURL, a.Load(), b.Load())
	}
	if a.Load() == 0 || b.Load() == 0 {
		t.Fatalf("a server got no claim: %d and %d", a.Load(), b.Load())
	}
}

// TestCutOffIsNotAnError: the cycles in flight when the run's Duration ends are not
// counted as failed.
func TestCutOffIsNotAnError(t *testing.T) {
	var claims atomic.Int64
	s := echoServer(t, &claims, 10)
	res, err := Run(context.Background(), Config{BaseURL: s.URL, Clients: 4, Cycles: 1000, Duration: 300 * time.Millisecond, KeyPrefix: "cut"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 10 || res.Errors != 0 {
		t.Fatalf("%d cycles, %d errors (%s); want the 10 answered and no error", res.Cycles, res.Errors, res.FirstError)
	}
}
