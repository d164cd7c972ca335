package idem_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
)

// orders is a real handler behind the middleware: it counts its runs and answers
// with the count, a Location and a cookie.
type orders struct {
	runs   atomic.Int32
	status func(run int32) int
	block  chan struct{}
	panics bool
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := o.runs.Add(1)
	if o.block != nil {
		<-o.block
	}
	if o.panics && n == 1 {
		panic("handler panicked")
	}
	body, _ := io.ReadAll(r.Body)
	status := http.StatusCreated
	if o.status != nil {
		status = o.status(n)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Not-Stored", "x")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"run":%d,"request":%q}`, n, body)
}

type reply struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, url, method, key, contentType, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url+"/orders", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return reply{}
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func serve(t *testing.T, h http.Handler, opts ...idem.MiddlewareOption) string {
	t.Helper()
	return serveWith(t, newClient(t), h, opts...)
}

func serveWith(t *testing.T, c *idem.Client, h http.Handler, opts ...idem.MiddlewareOption) string {
	t.Helper()
	hs := httptest.NewServer(idem.Middleware(c, opts...)(h))
	t.Cleanup(hs.Close)
	return hs.URL
}

func TestMiddlewareReplaysByteForByte(t *testing.T) {
	h := &orders{}
	url := serve(t, h)
	key := freshKey("mw-replay")
	first := send(t, url, "POST", key, "application/json", `{"item":"book","qty":1}`)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first request: %+v", first)
	}
	second := send(t, url, "POST", key, "application/json", `{"item":"book","qty":1}`)
	if second.status != first.status || second.body != first.body ||
		second.header.Get("Location") != first.header.Get("Location") ||
		second.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("replay differs:\nfirst  %+v\nsecond %+v", first, second)
	}
	if second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay not marked: %v", second.header)
	}
	if second.header.Get("Set-Cookie") != "" || second.header.Get("X-Not-Stored") != "" {
		t.Fatalf("replay carries headers that must not be stored: %v", second.header)
	}
	// The same JSON with other key order and spacing is the same request.
	third := send(t, url, "POST", key, "application/json", "{ \"qty\": 1,\n \"item\": \"book\" }")
	if third.status != 201 || third.body != first.body {
		t.Fatalf("reordered JSON: %+v", third)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestMiddlewareRefusesAChangedRequest(t *testing.T) {
	h := &orders{}
	url := serve(t, h)
	key := freshKey("mw-changed")
	send(t, url, "POST", key, "application/json", `{"item":"book"}`)
	r := send(t, url, "POST", key, "application/json", `{"item":"pen"}`)
	if r.status != 422 || !strings.Contains(r.body, "fingerprint_mismatch") || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("changed body: %+v", r)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	t.Run("409 at once", func(t *testing.T) {
		h := &orders{block: make(chan struct{})}
		url := serve(t, h)
		key := freshKey("mw-409")
		first := make(chan reply, 1)
		go func() { first <- send(t, url, "POST", key, "application/json", `{}`) }()
		waitUntil(t, "the first request to run", func() bool { return h.runs.Load() == 1 })
		dup := send(t, url, "POST", key, "application/json", `{}`)
		if dup.status != 409 || dup.header.Get("Retry-After") == "" || !strings.Contains(dup.body, "in_progress") {
			t.Fatalf("duplicate while the first runs: %+v", dup)
		}
		close(h.block)
		if r := <-first; r.status != 201 {
			t.Fatalf("first: %+v", r)
		}
	})
	t.Run("50 waiting duplicates run the handler once", func(t *testing.T) {
		h := &orders{block: make(chan struct{})}
		url := serve(t, h, idem.WithWait(20*time.Second))
		key := freshKey("mw-wait")
		var wg sync.WaitGroup
		replies := make(chan reply, 50)
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies <- send(t, url, "POST", key, "application/json", `{"n":1}`)
			}()
		}
		waitUntil(t, "the first request to run", func() bool { return h.runs.Load() == 1 })
		close(h.block)
		wg.Wait()
		close(replies)
		bodies := map[string]int{}
		for r := range replies {
			if r.status != 201 {
				t.Errorf("a duplicate got %d %s", r.status, r.body)
			}
			bodies[r.body]++
		}
		if n := h.runs.Load(); n != 1 || len(bodies) != 1 {
			t.Fatalf("handler ran %d times, %d distinct answers", n, len(bodies))
		}
	})
}

func TestMiddlewareReleasesOn5xxAndPanic(t *testing.T) {
	t.Run("5xx", func(t *testing.T) {
		h := &orders{status: func(run int32) int {
			if run == 1 {
				return 503
			}
			return 201
		}}
		url := serve(t, h)
		key := freshKey("mw-5xx")
		if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 503 {
			t.Fatalf("first: %+v", r)
		}
		if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after a 503: %+v", r)
		}
		if n := h.runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
	})
	t.Run("4xx is stored", func(t *testing.T) {
		h := &orders{status: func(int32) int { return 400 }}
		url := serve(t, h)
		key := freshKey("mw-4xx")
		send(t, url, "POST", key, "application/json", `{}`)
		if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 400 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay of a 400: %+v", r)
		}
		if n := h.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
	t.Run("panic", func(t *testing.T) {
		h := &orders{panics: true}
		url := serve(t, h)
		key := freshKey("mw-panic")
		req, _ := http.NewRequest("POST", url+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json") // the media type is part of the request
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("a panicking handler answered %d", resp.StatusCode)
		}
		if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 201 {
			t.Fatalf("retry after a panic: %+v", r)
		}
		if n := h.runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
	})
}

func TestMiddlewareKeyAndMethods(t *testing.T) {
	h := &orders{}
	url := serve(t, h)
	// No key: passes through, unprotected.
	send(t, url, "POST", "", "application/json", `{}`)
	send(t, url, "POST", "", "application/json", `{}`)
	// GET is not covered by default, even with a key.
	key := freshKey("mw-get")
	send(t, url, "GET", key, "application/json", "")
	send(t, url, "GET", key, "application/json", "")
	if n := h.runs.Load(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}

	required := serve(t, &orders{}, idem.RequireKey())
	r := send(t, required, "POST", "", "application/json", `{}`)
	var p map[string]any
	_ = json.Unmarshal([]byte(r.body), &p)
	if r.status != 400 || p["code"] != "missing_idempotency_key" {
		t.Fatalf("missing key with RequireKey: %+v", r)
	}
	r = send(t, required, "POST", strings.Repeat("k", 300), "application/json", `{}`)
	if r.status != 400 || !strings.Contains(r.body, "invalid_idempotency_key") {
		t.Fatalf("a 300-byte key: %+v", r)
	}
}

func TestMiddlewareWhenIdemdIsDown(t *testing.T) {
	d := ownDaemon(t)
	c, err := idem.New(d.URL, idem.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	closed := &orders{}
	closedURL := serveWith(t, c, closed)
	var reported atomic.Int32
	open := &orders{}
	openURL := serveWith(t, c, open, idem.WithFailOpen(func(*http.Request, error) { reported.Add(1) }))
	d.Kill()

	if r := send(t, closedURL, "POST", freshKey("down"), "application/json", `{}`); r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("fail closed: %+v", r)
	}
	if n := closed.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times without idemd", n)
	}
	if r := send(t, openURL, "POST", freshKey("down"), "application/json", `{}`); r.status != 201 {
		t.Fatalf("fail open: %+v", r)
	}
	if open.runs.Load() != 1 || reported.Load() != 1 {
		t.Fatalf("fail open ran the handler %d times and reported %d", open.runs.Load(), reported.Load())
	}
}
