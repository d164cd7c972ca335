package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// countingWork is an operation for Do that counts its runs.
func countingWork(runs *atomic.Int64) func(context.Context) (idem.Response, error) {
	return func(context.Context) (idem.Response, error) {
		n := runs.Add(1)
		return idem.Response{Status: 201, Body: []byte{byte('0' + n)}}, nil
	}
}

func TestReplayCacheAnswersWithoutTheDaemon(t *testing.T) {
	ctx := t.Context()
	d := ownDaemon(t)
	cached, err := idem.New(d.URL, idem.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	uncached, err := idem.New(d.URL, idem.WithRetries(0), idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	key, other := freshKey("cache"), freshKey("cache-off")
	var runs atomic.Int64
	for _, c := range []struct {
		client *idem.Client
		key    string
	}{{cached, key}, {uncached, other}} {
		if res, err := c.client.Do(ctx, c.key, "fp", countingWork(&runs)); err != nil || res.Replayed {
			t.Fatalf("first Do: %+v %v", res, err)
		}
	}

	d.Kill()
	res, err := cached.Do(ctx, key, "fp", countingWork(&runs))
	if err != nil || !res.Replayed || res.Status != 201 || string(res.Body) != "1" {
		t.Fatalf("replay with idemd down: %+v %v, want the stored answer from the cache", res, err)
	}
	// The cache answers only the fingerprint it saw; anything else asks idemd.
	if _, err := cached.Do(ctx, key, "another-fp", countingWork(&runs)); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("another fingerprint with idemd down: %v, want ErrUnavailable", err)
	}
	if _, err := uncached.Do(ctx, other, "fp", countingWork(&runs)); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("without the cache, idemd down: %v, want ErrUnavailable", err)
	}
	if runs.Load() != 2 {
		t.Fatalf("the work ran %d times, want 2", runs.Load())
	}
}

func TestReplayCacheLearnsFromClaims(t *testing.T) {
	ctx := t.Context()
	d := ownDaemon(t)
	writer, err := idem.New(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := idem.New(d.URL, idem.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	key := freshKey("learn")
	var runs atomic.Int64
	if _, err := writer.Do(ctx, key, "fp", countingWork(&runs)); err != nil {
		t.Fatal(err)
	}
	// The reader hears the result from idemd once, then from its cache.
	if res, err := reader.Do(ctx, key, "fp", countingWork(&runs)); err != nil || !res.Replayed {
		t.Fatalf("replay through idemd: %+v %v", res, err)
	}
	d.Kill()
	if res, err := reader.Do(ctx, key, "fp", countingWork(&runs)); err != nil || !res.Replayed || string(res.Body) != "1" {
		t.Fatalf("replay with idemd down: %+v %v", res, err)
	}
}

func TestReplayCacheRespectsExpiry(t *testing.T) {
	ctx := t.Context()
	c := newClient(t, idem.WithRetention(300*time.Millisecond))
	key := freshKey("expiry")
	var runs atomic.Int64
	if _, err := c.Do(ctx, key, "fp", countingWork(&runs)); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
	if err != nil || cl.Outcome != idem.Completed {
		t.Fatalf("replay: %+v %v", cl, err)
	}
	// Wait until the record's own expiry has passed (on this machine's clock, which the
	// daemon shares), then the key runs again instead of replaying from memory.
	deadline := time.Now().Add(testenv.Scale(10 * time.Second))
	for !time.Now().After(cl.ExpiresAt.Add(10 * time.Millisecond)) {
		if time.Now().After(deadline) {
			t.Fatalf("expires_at %s is not near", cl.ExpiresAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err := c.Do(ctx, key, "fp", countingWork(&runs))
	if err != nil || res.Replayed || runs.Load() != 2 {
		t.Fatalf("Do after expires_at: %+v %v, %d runs; want a second run", res, err, runs.Load())
	}
}

func TestReplayCacheAndPurge(t *testing.T) {
	ctx := t.Context()
	stale := newClient(t) // the default cache: a purge elsewhere is seen within 30 s
	fresh := newClient(t, idem.WithReplayCache(1<<20, 200*time.Millisecond))
	admin := newClient(t, idem.WithReplayCache(0, 0))
	key := freshKey("purge")
	var runs atomic.Int64
	for _, c := range []*idem.Client{stale, fresh} {
		if _, err := c.Do(ctx, key, "fp", countingWork(&runs)); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs before the purge, want 1", runs.Load())
	}

	if err := admin.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	// A purge through another client: the default cache still replays for now.
	if res, err := stale.Do(ctx, key, "fp", countingWork(&runs)); err != nil || !res.Replayed {
		t.Fatalf("default cache right after a purge elsewhere: %+v %v, want the cached replay", res, err)
	}
	// A short max age sees it once the entry is older than that.
	deadline := time.Now().Add(testenv.Scale(10 * time.Second))
	for {
		res, err := fresh.Do(ctx, key, "fp", countingWork(&runs))
		if err != nil {
			t.Fatal(err)
		}
		if !res.Replayed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the purge was not seen within 10 s with a 200 ms max age")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A purge through the client itself is seen at once.
	if err := fresh.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	before := runs.Load()
	if res, err := fresh.Do(ctx, key, "fp", countingWork(&runs)); err != nil || res.Replayed || runs.Load() != before+1 {
		t.Fatalf("Do after its own purge: %+v %v, want a new run", res, err)
	}
}

// TestReplayCacheStorm: several clients, each with its cache, call Do on a few keys
// at once; every key runs exactly once and every caller gets its one result.
func TestReplayCacheStorm(t *testing.T) {
	ctx := t.Context()
	clients := make([]*idem.Client, 4)
	for i := range clients {
		clients[i] = newClient(t)
	}
	const keys, callsPerKey = 8, 24
	prefix := freshKey("storm")
	runs := make([]atomic.Int64, keys)
	results := make([][]string, keys)
	for k := range results {
		results[k] = make([]string, callsPerKey)
	}
	errs := make(chan error, keys*callsPerKey)
	var wg sync.WaitGroup
	for k := range keys {
		for i := range callsPerKey {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("%s-%d", prefix, k)
				res, err := clients[i%len(clients)].Do(ctx, key, "fp", func(context.Context) (idem.Response, error) {
					n := runs[k].Add(1)
					return idem.Response{Status: 201, Body: fmt.Appendf(nil, "%d-%d", k, n)}, nil
				}, idem.DoOptions{Wait: 20 * time.Second})
				if err != nil {
					errs <- err
					return
				}
				results[k][i] = string(res.Body)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k := range keys {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key %d ran %d times", k, n)
		}
		for i, r := range results[k] {
			if want := fmt.Sprintf("%d-1", k); r != want {
				t.Errorf("key %d, call %d got %q, want %q", k, i, r, want)
			}
		}
	}
}

// TestMiddlewareReplaysFromTheCache: the middleware's replay of an answer it stored
// comes from the cache, per user, with no call to idemd.
func TestMiddlewareReplaysFromTheCache(t *testing.T) {
	d := ownDaemon(t)
	c, err := idem.New(d.URL, idem.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	h := &orders{}
	url := serveWith(t, c, h)
	key := freshKey("mw-cache")
	first := call{key: key, body: `{"amount":1}`}.do(t, url)
	if first.status != 201 || first.replayed() {
		t.Fatalf("first request: %+v", first)
	}
	d.Kill()
	again := call{key: key, body: `{"amount":1}`}.do(t, url)
	if again.status != 201 || !again.replayed() || again.body != first.body || h.runs.Load() != 1 {
		t.Fatalf("replay with idemd down: %+v (first %+v), %d runs", again, first, h.runs.Load())
	}
	// Another user's request with the same key is not this user's answer: it asks
	// idemd, which is down.
	other := call{key: key, user: "bob", body: `{"amount":1}`}.do(t, url)
	if other.status != 503 || h.runs.Load() != 1 {
		t.Fatalf("another user's request with idemd down: %+v, %d runs", other, h.runs.Load())
	}
}

// TestReplayCacheOwnPurgeBeatsAClaimInFlight: a claim that idemd answered before a
// purge through the same client, but whose answer arrives after the purge returned,
// must not put the purged record back into the cache.
func TestReplayCacheOwnPurgeBeatsAClaimInFlight(t *testing.T) {
	ctx := t.Context()
	held, resume := make(chan struct{}), make(chan struct{})
	var claims atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, daemonURL+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if r.URL.Path == "/v1/claim" && claims.Add(1) == 1 {
			// idemd has answered; the answer is late to reach the client.
			close(held)
			<-resume
		}
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(proxy.Close)
	c, err := idem.New(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	key := freshKey("purge-race")
	var runs atomic.Int64
	if _, err := newClient(t).Do(ctx, key, "fp", countingWork(&runs)); err != nil {
		t.Fatal(err)
	}

	late := make(chan error, 1)
	go func() {
		cl, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
		if err == nil && cl.Outcome != idem.Completed {
			err = fmt.Errorf("the claim answered before the purge: %+v, want completed", cl)
		}
		late <- err
	}()
	<-held
	if err := c.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	close(resume)
	if err := <-late; err != nil {
		t.Fatal(err)
	}
	res, err := c.Do(ctx, key, "fp", countingWork(&runs))
	if err != nil || res.Replayed || runs.Load() != 2 {
		t.Fatalf("Do after its own client's purge: %+v %v, %d runs; want a new run, not the purged answer", res, err, runs.Load())
	}
}
