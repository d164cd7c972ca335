package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testredis"
	"github.com/idemd/idemd/internal/wait"
)

func startMain(t *testing.T, args ...string) (*Main, context.CancelFunc, chan error) {
	t.Helper()
	m := NewMain()
	if err := m.ParseFlags(append([]string{"--listen", "127.0.0.1:0", "--log-level", "warn"}, args...)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return m, cancel, done
}

func post(url, body string) (int, string, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestGracefulShutdown cancels the daemon while a claim is waiting: the waiting request
// must still get its answer, new connections must be refused, and Run must return.
func TestGracefulShutdown(t *testing.T) {
	r := testredis.Start(t)
	m, stop, done := startMain(t, "--store", r.URL(), "--shutdown-timeout", "10s")
	base := "http://" + m.Addr()
	if code, body, err := post(base+"/v1/claim", `{"key":"held","lease_ms":60000}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}

	inflight := make(chan int, 1)
	go func() {
		code, _, _ := post(base+"/v1/claim", `{"key":"held","wait_ms":1500}`)
		inflight <- code
	}()
	// Wait until the daemon counts the waiter, so shutdown finds it in flight.
	wait.For(t, 10*time.Second, "the daemon to count the waiting claim", func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), "idemd_claim_waiters 1\n")
	})
	stop()
	if code := <-inflight; code != http.StatusConflict {
		t.Fatalf("in-flight claim answered %d during shutdown, want its 409 after the wait", code)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after shutdown")
	}
	if _, _, err := post(base+"/v1/claim", `{"key":"after"}`); err == nil {
		t.Fatal("the daemon still accepts requests after shutdown")
	}
}

func TestFlagsRefuseNonsense(t *testing.T) {
	for _, args := range [][]string{
		{"--max-response-bytes", "0"},
		{"--retention", "0s"},
		{"--retention", "800h"},
		{"--log-level", "loud"},
		{"stray"},
	} {
		if err := NewMain().ParseFlags(args); err == nil {
			t.Errorf("ParseFlags(%q) accepted", args)
		}
	}
}

// TestRequireNoeviction starts the daemon on a Redis that evicts keys: a warning by
// default, a refusal with --require-noeviction.
func TestRequireNoeviction(t *testing.T) {
	r := testredis.Start(t, "--maxmemory-policy", "allkeys-lru")
	m := NewMain()
	if err := m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--store", r.URL(), "--require-noeviction"}); err != nil {
		t.Fatal(err)
	}
	err := m.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("Run on an evicting Redis with --require-noeviction: %v", err)
	}
	// Without the flag it starts and serves.
	started, _, _ := startMain(t, "--store", r.URL())
	if code, body, err := post("http://"+started.Addr()+"/v1/claim", `{"key":"evicting"}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}
}
