package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// gate is a transport to the real daemon that records each request's path and number
// of batch items, and holds the first request until it is opened, so that a test can
// gather calls behind it deterministically.
type gate struct {
	mu    sync.Mutex
	sent  []string
	items []int
	held  chan struct{}
	first sync.Once
}

func newGate() *gate { return &gate{held: make(chan struct{})} }

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	n := 0
	if req.URL.Path == "/v1/batch" {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		var b struct {
			Items []json.RawMessage `json:"items"`
		}
		_ = json.Unmarshal(body, &b)
		n = len(b.Items)
	}
	g.mu.Lock()
	g.sent = append(g.sent, req.URL.Path)
	g.items = append(g.items, n)
	g.mu.Unlock()
	first := false
	g.first.Do(func() { first = true })
	if first {
		<-g.held
	}
	return http.DefaultTransport.RoundTrip(req)
}

func (g *gate) requests() ([]string, []int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.sent...), append([]int(nil), g.items...)
}

// queue starts call in a goroutine and waits until it is queued behind the held
// request, so that calls join the next batch in the order they are started.
func queue(t *testing.T, c *idem.Client, queued int, call func()) {
	t.Helper()
	go call()
	testenv.WaitFor(t, 10*time.Second, "the call to be queued", func() bool { return idem.QueuedCalls(c) == queued })
}

// TestBatchingGathersConcurrentCalls checks that calls made while one is in flight go
// out together as one batch when it returns, each answered as it would be alone.
func TestBatchingGathersConcurrentCalls(t *testing.T) {
	t.Parallel()
	g := newGate()
	c := newClient(t, idem.WithHTTPClient(&http.Client{Transport: g}))
	ctx := context.Background()
	held, k1, k2 := freshKey("held"), freshKey("k1"), freshKey("k2")
	done := newClient(t, idem.WithBatching(false))
	finished := freshKey("finished")
	cl, err := done.Claim(ctx, finished, idem.ClaimOptions{Fingerprint: "f"})
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Complete(ctx, finished, cl.Token, idem.Response{Status: 201, Body: []byte("made")}); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		claim *idem.Claim
		err   error
	}
	answers := make([]answer, 6)
	var wg sync.WaitGroup
	claim := func(i int, key, fingerprint string) func() {
		wg.Add(1)
		return func() {
			defer wg.Done()
			cl, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: fingerprint})
			answers[i] = answer{cl, err}
		}
	}
	go claim(0, held, "")()
	testenv.WaitFor(t, 10*time.Second, "the first claim to be sent", func() bool { s, _ := g.requests(); return len(s) == 1 })
	queue(t, c, 1, claim(1, k1, "a"))
	queue(t, c, 2, claim(2, k1, "b"))
	queue(t, c, 3, claim(3, k1, "a"))
	queue(t, c, 4, claim(4, k2, ""))
	queue(t, c, 5, claim(5, finished, "f"))
	close(g.held)
	wg.Wait()

	sent, items := g.requests()
	if len(sent) != 2 || sent[0] != "/v1/claim" || sent[1] != "/v1/batch" || items[1] != 5 {
		t.Fatalf("requests %v with %v items, want one claim and then one batch of 5", sent, items)
	}
	for i, key := range []int{0, 1, 4} {
		if a := answers[key]; a.err != nil || a.claim.Outcome != idem.Acquired || a.claim.Token == "" {
			t.Fatalf("claim %d (%d): %+v %v, want acquired", i, key, a.claim, a.err)
		}
	}
	if a := answers[2]; !errors.Is(a.err, idem.ErrFingerprintMismatch) {
		t.Fatalf("the second claim of k1 with another fingerprint: %v, want ErrFingerprintMismatch", a.err)
	}
	var p *idem.Problem
	if a := answers[3]; !errors.Is(a.err, idem.ErrInProgress) || !errors.As(a.err, &p) || p.RetryAfter <= 0 || p.Status != http.StatusConflict {
		t.Fatalf("the third claim of k1: %v, want ErrInProgress with RetryAfter", a.err)
	}
	if a := answers[5]; a.err != nil || a.claim.Outcome != idem.Completed || string(a.claim.Response.Body) != "made" {
		t.Fatalf("the claim of a finished key: %+v %v, want its result replayed", a.claim, a.err)
	}

	// The leases from the batch work like any other, and their completions share a
	// batch too.
	var cwg sync.WaitGroup
	errs := make([]error, 2)
	for i, a := range []answer{answers[1], answers[4]} {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			errs[i] = c.Complete(ctx, []string{k1, k2}[i], a.claim.Token, idem.Response{Status: 200})
		}()
	}
	cwg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("completions: %v", errs)
	}
	for _, key := range []string{k1, k2} {
		if rec, err := done.Lookup(ctx, key); err != nil || rec.State != "completed" {
			t.Fatalf("lookup %q: %+v %v, want completed", key, rec, err)
		}
	}
}

// TestBatchingLeavesOutCallersThatLeft checks that a call whose caller gave up while it
// was queued is not sent, and that the others of its batch are answered.
func TestBatchingLeavesOutCallersThatLeft(t *testing.T) {
	t.Parallel()
	g := newGate()
	c := newClient(t, idem.WithHTTPClient(&http.Client{Transport: g}))
	ctx := context.Background()
	held, gone, stays := freshKey("held"), freshKey("gone"), freshKey("stays")
	errs := make(chan error, 3)
	go func() { _, err := c.Claim(ctx, held, idem.ClaimOptions{}); errs <- err }()
	testenv.WaitFor(t, 10*time.Second, "the first claim to be sent", func() bool { s, _ := g.requests(); return len(s) == 1 })
	leave, cancel := context.WithCancel(ctx)
	queue(t, c, 1, func() { _, err := c.Claim(leave, gone, idem.ClaimOptions{}); errs <- err })
	queue(t, c, 2, func() { _, err := c.Claim(ctx, stays, idem.ClaimOptions{}); errs <- err })
	cancel()
	// The held claim cannot answer before the gate opens, so the first answer is the
	// cancelled caller's.
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left: %v, want context.Canceled", err)
	}
	close(g.held)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if sent, items := g.requests(); len(sent) != 2 || sent[1] != "/v1/claim" {
		t.Fatalf("requests %v with %v items, want two claims: the held one and the one left alone", sent, items)
	}
	plain := newClient(t, idem.WithBatching(false))
	if _, err := plain.Lookup(ctx, gone); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the left caller's key: %v, want ErrNotFound (never sent)", err)
	}
	if rec, err := plain.Lookup(ctx, stays); err != nil || rec.State != "pending" {
		t.Fatalf("the staying caller's key: %+v %v, want pending", rec, err)
	}
}

// TestBatchingFallsBackWithoutBatchEndpoint puts a proxy in front of the real daemon
// that answers /v1/batch as an unknown endpoint, as a daemon from before it does: the
// calls of the refused batch are sent again one by one, and no batch is sent again.
func TestBatchingFallsBackWithoutBatchEndpoint(t *testing.T) {
	t.Parallel()
	target, err := url.Parse(daemonURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	batches := 0
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/batch" {
			mu.Lock()
			batches++
			mu.Unlock()
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"type":"urn:idemd:problem:not_found","title":"Not Found","status":404,"code":"not_found"}`))
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(old.Close)
	g := newGate()
	c, err := idem.New(old.URL, idem.WithHTTPClient(&http.Client{Transport: g}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run := func(keys ...string) []error {
		errs := make([]error, len(keys))
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = c.Claim(ctx, k, idem.ClaimOptions{}) }()
		}
		wg.Wait()
		return errs
	}
	held := freshKey("held")
	first := make(chan error, 1)
	go func() { _, err := c.Claim(ctx, held, idem.ClaimOptions{}); first <- err }()
	testenv.WaitFor(t, 10*time.Second, "the first claim to be sent", func() bool { s, _ := g.requests(); return len(s) == 1 })
	k1, k2 := freshKey("k1"), freshKey("k2")
	var errs []error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs = run(k1, k2) }()
	testenv.WaitFor(t, 10*time.Second, "both calls to be queued", func() bool { return idem.QueuedCalls(c) == 2 })
	close(g.held)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d behind a daemon without batches: %v", i, err)
		}
	}
	for i, err := range run(freshKey("a"), freshKey("b"), freshKey("c"), freshKey("d")) {
		if err != nil {
			t.Fatalf("later claim %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if batches != 1 {
		t.Fatalf("%d batches reached the daemon without a batch endpoint, want 1 and then none", batches)
	}
}

// TestBatchAnswersAreReadInOnePass sends batches to the real daemon and checks that
// the client reads its answers itself, in one pass, exactly as encoding/json reads
// them: a claim that acquires, an extend, a complete, a claim that replays, and a
// release.
func TestBatchAnswersAreReadInOnePass(t *testing.T) {
	send := func(items ...map[string]any) []byte {
		t.Helper()
		body, err := json.Marshal(map[string]any{"items": items})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(daemonURL+"/v1/batch", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		answer, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("batch: %d %s %v", resp.StatusCode, answer, err)
		}
		return answer
	}
	read := func(answer []byte) {
		t.Helper()
		if fast, same := idem.ReadsBatchAnswer(answer); !fast || !same {
			t.Fatalf("the answer %s was read in one pass: %v, as encoding/json reads it: %v", answer, fast, same)
		}
	}
	done, failed := freshKey("one-pass-done"), freshKey("one-pass-failed")
	first := send(
		map[string]any{"claim": map[string]any{"key": done, "fingerprint": "sha256:ab", "owner": "test", "lease_ms": 30000}},
		map[string]any{"claim": map[string]any{"key": failed, "lease_ms": 30000}},
	)
	read(first)
	var claims struct {
		Results []struct {
			Acquired struct {
				LeaseToken string `json:"lease_token"`
			} `json:"acquired"`
		} `json:"results"`
	}
	if err := json.Unmarshal(first, &claims); err != nil || len(claims.Results) != 2 {
		t.Fatalf("claims: %s %v", first, err)
	}
	tokenDone, tokenFailed := claims.Results[0].Acquired.LeaseToken, claims.Results[1].Acquired.LeaseToken
	read(send(
		map[string]any{"extend": map[string]any{"key": done, "lease_token": tokenDone, "lease_ms": 30000}},
		map[string]any{"complete": map[string]any{"key": done, "lease_token": tokenDone, "response": map[string]any{
			"status": 201, "headers": map[string][]string{"content-type": {"application/json"}, "location": {"/orders/1"}}, "body": []byte(`{"id":1}`)}}},
		map[string]any{"release": map[string]any{"key": failed, "lease_token": tokenFailed, "mode": "fail",
			"response": map[string]any{"status": 402, "body": []byte{}}}},
	))
	read(send(
		map[string]any{"claim": map[string]any{"key": done, "fingerprint": "sha256:ab"}},
		map[string]any{"claim": map[string]any{"key": failed}},
	))
}
