package idem_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// The tests below run the middleware over real HTTP in front of a real idemd; the
// rows they check are those of docs/middleware.md.

// orders is a real handler behind the middleware: it counts its runs and answers
// with the count, the caller, a Location and a cookie.
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
	fmt.Fprintf(w, `{"run":%d,"user":%q,"request":%q}`, n, r.Header.Get("X-User"), body)
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

func (r reply) problemCode() string {
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Code
}

// call is one request to a service behind the middleware. user stands for the
// authentication in front of the middleware: the scope is read from X-User.
type call struct {
	method, path, user, key, contentType, body string
	keyLines                                   []string
}

func (c call) send(t *testing.T, ctx context.Context, url string) (reply, error) {
	t.Helper()
	method, path, user, contentType := c.method, c.path, c.user, c.contentType
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/orders"
	}
	if user == "" {
		user = "alice"
	}
	if contentType == "" {
		contentType = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, url+path, strings.NewReader(c.body))
	if err != nil {
		return reply{}, err
	}
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	for _, l := range c.keyLines {
		req.Header.Add("Idempotency-Key", l)
	}
	if user != "-" {
		req.Header.Set("X-User", user)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := noRedirects.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

// noRedirects shows a redirect as it is answered.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func (c call) do(t *testing.T, url string) reply {
	t.Helper()
	r, err := c.send(t, t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func send(t *testing.T, url, method, key, contentType, body string) reply {
	t.Helper()
	return call{method: method, key: key, contentType: contentType, body: body}.do(t, url)
}

// byUser is the scope of the tests: the user the request says it is.
func byUser(r *http.Request) string { return r.Header.Get("X-User") }

func serve(t *testing.T, h http.Handler, opts ...idem.MiddlewareOption) string {
	t.Helper()
	return serveWith(t, newClient(t), h, opts...)
}

func serveWith(t *testing.T, c *idem.Client, h http.Handler, opts ...idem.MiddlewareOption) string {
	t.Helper()
	hs := httptest.NewServer(idem.Middleware(c, append([]idem.MiddlewareOption{idem.WithScope(byUser)}, opts...)...)(h))
	t.Cleanup(hs.Close)
	return hs.URL
}

// incidents records what the incident hook reports.
type incidents struct {
	mu   sync.Mutex
	seen []idem.Incident
}

func (l *incidents) option() idem.MiddlewareOption {
	return idem.WithIncidentHook(func(_ *http.Request, inc idem.Incident) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.seen = append(l.seen, inc)
	})
}

func (l *incidents) count(kind idem.IncidentKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, inc := range l.seen {
		if inc.Kind == kind {
			n++
		}
	}
	return n
}

func (l *incidents) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.seen)
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func TestMiddlewareReplaysByteForByte(t *testing.T) {
	h := &orders{}
	url := serve(t, h)
	key := freshKey("mw-replay")
	first := send(t, url, "POST", key, "application/json", `{"item":"book","qty":1}`)
	if first.status != 201 || first.replayed() || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first request: %+v", first)
	}
	second := send(t, url, "POST", key, "application/json", `{"item":"book","qty":1}`)
	if second.status != first.status || second.body != first.body ||
		second.header.Get("Location") != first.header.Get("Location") ||
		second.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("replay differs:\nfirst  %+v\nsecond %+v", first, second)
	}
	if !second.replayed() {
		t.Fatalf("replay not marked: %v", second.header)
	}
	if second.header.Get("Set-Cookie") != "" || second.header.Get("X-Not-Stored") != "" {
		t.Fatalf("replay carries headers that must not be stored: %v", second.header)
	}
	// The same JSON with other key order, spacing and number spelling is the same request.
	third := send(t, url, "POST", key, "application/json", "{ \"qty\": 1.0,\n \"item\": \"b\\u006fok\" }")
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
	for _, tc := range []struct {
		name          string
		first, second call
	}{
		{"another body", call{body: `{"item":"book"}`}, call{body: `{"item":"pen"}`}},
		{"another query", call{path: "/orders?amount=1", body: `{}`}, call{path: "/orders?amount=1000", body: `{}`}},
		{"another path", call{path: "/orders/a", body: `{}`}, call{path: "/orders/%61", body: `{}`}},
		{"another method", call{body: `{}`}, call{method: "PATCH", body: `{}`}},
		{"another media type", call{body: `{}`}, call{contentType: "text/plain", body: `{}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.runs.Load()
			key := freshKey("mw-changed")
			tc.first.key, tc.second.key = key, key
			tc.first.do(t, url)
			r := tc.second.do(t, url)
			if r.status != 422 || r.problemCode() != "fingerprint_mismatch" || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("changed request: %+v", r)
			}
			if n := h.runs.Load() - before; n != 1 {
				t.Fatalf("handler ran %d times", n)
			}
		})
	}
}

func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	t.Run("409 at once", func(t *testing.T) {
		h := &orders{block: make(chan struct{})}
		url := serve(t, h)
		key := freshKey("mw-409")
		first := make(chan reply, 1)
		go func() { first <- send(t, url, "POST", key, "application/json", `{}`) }()
		testenv.WaitFor(t, 10*time.Second, "the first request to run", func() bool { return h.runs.Load() == 1 })
		dup := send(t, url, "POST", key, "application/json", `{}`)
		if dup.status != 409 || dup.header.Get("Retry-After") == "" || dup.problemCode() != "in_progress" {
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
		testenv.WaitFor(t, 10*time.Second, "the first request to run", func() bool { return h.runs.Load() == 1 })
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
		if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 201 || r.replayed() {
			t.Fatalf("retry after a 503: %+v", r)
		}
		if n := h.runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
	})
	t.Run("panic", func(t *testing.T) {
		h := &orders{panics: true}
		url := serve(t, h)
		key := freshKey("mw-panic")
		if _, err := (call{key: key, body: `{}`}).send(t, t.Context(), url); err == nil {
			t.Fatal("a panicking handler answered")
		}
		if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 201 {
			t.Fatalf("retry after a panic: %+v", r)
		}
		if n := h.runs.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2", n)
		}
	})
}

// R15: a handler that panics after its status is on the wire cut its answer short.
// A status to store means the work started, so the key keeps a response_not_stored
// failure instead of running again; a status the middleware frees the key for still
// frees it.
func TestMiddlewarePanicAfterTheStatus(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		wantRuns int32
	}{
		{"after 201 and part of the body", http.StatusCreated, 1},
		{"after a 503", http.StatusServiceUnavailable, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			var inc incidents
			url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				w.Header().Set("Content-Type", "application/json")
				if n > 1 {
					w.WriteHeader(http.StatusCreated)
					fmt.Fprint(w, `{"run":2}`)
					return
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, `{"partial":`)
				http.NewResponseController(w).Flush()
				panic("handler panicked")
			}), inc.option())
			key := freshKey("mw-panic-after-status")
			first, err := call{key: key, body: `{}`}.send(t, t.Context(), url)
			if err == nil && first.body != `{"partial":` {
				t.Fatalf("first: %+v", first)
			}
			retry := call{key: key, body: `{}`}.do(t, url)
			if tc.wantRuns == 1 {
				if retry.status != 409 || retry.problemCode() != "response_not_stored" || !retry.replayed() {
					t.Fatalf("retry after a panic past a 201: %+v", retry)
				}
				if n := inc.count(idem.IncidentResultNotStored); n != 1 {
					t.Fatalf("%d result_not_stored incidents, want 1: %s", n, &inc)
				}
			} else if retry.status != 201 || retry.replayed() {
				t.Fatalf("retry after a panic past a 503: %+v", retry)
			}
			if n := runs.Load(); n != tc.wantRuns {
				t.Fatalf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

// Finding 5: only results are stored. A 4xx other than 402 says the operation did
// not run, so the client may fix its request or wait, and retry with the same key.
func TestMiddlewareStoresOnlyResults(t *testing.T) {
	for _, tc := range []struct {
		status int
		stored bool
		opts   []idem.MiddlewareOption
	}{
		{status: 200, stored: true},
		{status: 201, stored: true},
		{status: 303, stored: true},
		{status: 402, stored: true},
		{status: 400},
		{status: 401},
		{status: 403},
		{status: 404},
		{status: 408},
		{status: 409},
		{status: 422},
		{status: 429},
		{status: 409, stored: true, opts: []idem.MiddlewareOption{idem.WithStoredStatuses(func(s int) bool { return s < 300 || s == 409 })}},
	} {
		t.Run(fmt.Sprintf("%d stored %v", tc.status, tc.stored), func(t *testing.T) {
			h := &orders{status: func(run int32) int {
				if run == 1 {
					return tc.status
				}
				return 201
			}}
			url := serve(t, h, tc.opts...)
			key := freshKey("mw-status")
			first := send(t, url, "POST", key, "application/json", `{}`)
			second := send(t, url, "POST", key, "application/json", `{}`)
			if first.status != tc.status {
				t.Fatalf("first: %+v", first)
			}
			switch {
			case tc.stored && (second.status != tc.status || !second.replayed() || second.body != first.body || h.runs.Load() != 1):
				t.Fatalf("a %d should be stored and replayed; second %+v, %d runs", tc.status, second, h.runs.Load())
			case !tc.stored && (second.status != 201 || second.replayed() || h.runs.Load() != 2):
				t.Fatalf("a %d should leave the key free; second %+v, %d runs", tc.status, second, h.runs.Load())
			}
		})
	}
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
	if r := send(t, required, "POST", "", "application/json", `{}`); r.status != 400 || r.problemCode() != "missing_idempotency_key" {
		t.Fatalf("missing key with RequireKey: %+v", r)
	}
	for _, bad := range [][]string{{strings.Repeat("k", 256)}, {`"unterminated`}, {"a b"}, {`"k";p=1`}, {"a", "a"}} {
		if r := (call{keyLines: bad, body: `{}`}).do(t, required); r.status != 400 || r.problemCode() != "invalid_idempotency_key" {
			t.Fatalf("key %q: %+v", bad, r)
		}
	}
}

// The header is a Structured Field string; the same characters bare are the same key.
func TestMiddlewareReadsTheKeyAsAStructuredField(t *testing.T) {
	h := &orders{}
	url := serve(t, h)
	key := freshKey("mw-sf")
	first := call{key: `"` + key + `"`, body: `{}`}.do(t, url)
	second := call{key: key, body: `{}`}.do(t, url)
	if first.status != 201 || second.status != 201 || !second.replayed() || h.runs.Load() != 1 {
		t.Fatalf("quoted then bare: %+v, %+v, %d runs", first, second, h.runs.Load())
	}
	escaped := call{key: `"a \"quoted\" key ` + key + `"`, body: `{}`}.do(t, url)
	again := call{key: `"a \"quoted\" key ` + key + `"`, body: `{}`}.do(t, url)
	if escaped.status != 201 || !again.replayed() || h.runs.Load() != 2 {
		t.Fatalf("escaped key: %+v, %+v, %d runs", escaped, again, h.runs.Load())
	}
	// The record is under the documented idemd key.
	rec, err := newClient(t).Lookup(t.Context(), idem.MiddlewareKey("alice", `a "quoted" key `+key))
	if err != nil || rec.State != "completed" {
		t.Fatalf("lookup of the middleware's key: %+v %v", rec, err)
	}
}

// Finding 1: a handler that returns without writing because its client went away
// did not run; the key stays free for the retry.
func TestMiddlewareCancelledRequestLeavesTheKeyFree(t *testing.T) {
	var runs atomic.Int32
	started := make(chan struct{})
	var inc incidents
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-r.Context().Done() // the work stops with its request
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "charged")
	}), idem.WithWait(20*time.Second), inc.option())
	key := freshKey("mw-cancel")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := call{key: key, body: `{"amount":1}`}.send(t, ctx, url)
		done <- err
	}()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled request: %v", err)
	}
	retry := call{key: key, body: `{"amount":1}`}.do(t, url)
	if retry.status != 201 || retry.body != "charged" || retry.replayed() {
		t.Fatalf("retry after a cancelled request: %+v", retry)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// claimWaiters reads idemd's gauge of claims waiting on a key.
func claimWaiters(t *testing.T, d *testenv.Daemon) string {
	t.Helper()
	resp, err := http.Get(d.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if value, ok := strings.CutPrefix(line, "idemd_claim_waiters "); ok {
			return strings.TrimSpace(value)
		}
	}
	t.Fatal("idemd's /metrics has no idemd_claim_waiters")
	return ""
}

// C3a: a duplicate waiting on the key stops waiting when its client leaves. Its call
// to idemd is given up, so idemd's waiter goes away at once rather than after the wait,
// and its handler never runs.
func TestMiddlewareWaitEndsWhenTheClientLeaves(t *testing.T) {
	d := ownDaemon(t)
	c, err := idem.New(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	h := &orders{block: make(chan struct{})}
	url := serveWith(t, c, h, idem.WithWait(30*time.Second))
	// Lets the first request end even when the test fails, so that the server can close.
	release := sync.OnceFunc(func() { close(h.block) })
	t.Cleanup(release)
	key := freshKey("mw-wait-gone")
	body := `{"amount":1}`

	first := make(chan reply, 1)
	go func() { first <- call{key: key, body: body}.do(t, url) }()
	testenv.WaitFor(t, 10*time.Second, "the first request to run", func() bool { return h.runs.Load() == 1 })

	// The duplicate, on a connection of its own that the test closes.
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nX-User: alice\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	testenv.WaitFor(t, 20*time.Second, "idemd to see the duplicate wait", func() bool { return claimWaiters(t, d) == "1" })
	conn.Close()
	// Well within the 30 s wait: the wait must end because the client left, not because
	// it ran out.
	testenv.WaitFor(t, 20*time.Second, "idemd's waiter to go", func() bool { return claimWaiters(t, d) == "0" })
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times while the first request held the key, want 1", n)
	}

	release()
	if r := <-first; r.status != 201 || r.replayed() {
		t.Fatalf("first: %+v", r)
	}
	rec, err := c.Lookup(t.Context(), idem.MiddlewareKey("alice", key))
	if err != nil || rec.State != "completed" || rec.Attempt != 1 {
		t.Fatalf("the key after the first request: %+v, %v", rec, err)
	}
	retry := call{key: key, body: body}.do(t, url)
	if retry.status != 201 || !retry.replayed() || !strings.Contains(retry.body, `"run":1`) {
		t.Fatalf("a retry: %+v", retry)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// Finding 2: the key is scoped; one user never gets another's answer.
func TestMiddlewareScopesKeysByUser(t *testing.T) {
	h := &orders{}
	var inc incidents
	url := serve(t, h, inc.option())
	key := freshKey("shared")
	alice := call{user: "alice", key: key, body: `{"amount":1}`}.do(t, url)
	bob := call{user: "bob", key: key, body: `{"amount":1}`}.do(t, url)
	if alice.status != 201 || bob.status != 201 || bob.replayed() || !strings.Contains(bob.body, `"user":"bob"`) {
		t.Fatalf("bob got: %+v", bob)
	}
	again := call{user: "alice", key: key, body: `{"amount":1}`}.do(t, url)
	if !again.replayed() || again.body != alice.body {
		t.Fatalf("alice's retry: %+v", again)
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}

	// No scope for the request: refused, nothing runs.
	r := call{user: "-", key: freshKey("anonymous"), body: `{}`}.do(t, url)
	if r.status != 500 || r.problemCode() != "idempotency_scope_missing" || h.runs.Load() != 2 || inc.count(idem.IncidentScopeMissing) != 1 {
		t.Fatalf("request without a scope: %+v, %d runs, incidents %v", r, h.runs.Load(), &inc)
	}
	// No scope option: the middleware cannot be built.
	mustPanic(t, "Middleware without WithScope", func() { idem.Middleware(newClient(t)) })
}

// Finding 3: Idempotency-Key values never reach the keys the service's own code
// uses with Do and Once.
func TestMiddlewareCannotReachTheServicesOwnKeys(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	h := &orders{}
	url := serve(t, h)

	job := freshKey("report:2026-11")
	if _, err := c.Do(ctx, job, "", func(context.Context) (idem.Response, error) {
		return idem.Response{Status: 200, Body: []byte("internal report")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	r := call{key: job, body: `{}`}.do(t, url)
	if r.status != 201 || r.replayed() || strings.Contains(r.body, "internal report") {
		t.Fatalf("a request named the internal job's key: %+v", r)
	}

	email := freshKey("welcome-email:user-42")
	call{key: email, body: `{}`}.do(t, url)
	sent := false
	if err := c.Once(ctx, email, func(context.Context) error { sent = true; return nil }); err != nil || !sent {
		t.Fatalf("a request suppressed the internal send: sent %v, %v", sent, err)
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// authDaemon starts a daemon with one tenant and returns it and the tenant's token.
func authDaemon(t *testing.T, tenant string) (*testenv.Daemon, string) {
	t.Helper()
	token := "token-" + hex.EncodeToString([]byte(t.Name()))
	sum := sha256.Sum256([]byte(token))
	file := filepath.Join(t.TempDir(), "auth.yaml")
	cfg := fmt.Sprintf("tenants:\n  team: %s\ntokens:\n  - tenant: team\n    scopes: [use, admin]\n    sha256: %s\n", tenant, hex.EncodeToString(sum[:]))
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return ownDaemon(t, "--auth-file", file), token
}

// Finding 4: fail-open is for an idemd that cannot be reached, never for its answer.
func TestMiddlewareNeverFailsOpenOnAnAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tenant string
		token  func(valid string) string
	}{
		{"revoked token (401)", "{}", func(string) string { return "revoked-token" }},
		{"tenant over its rate (429)", "{rate: 0.001, burst: 3}", func(valid string) string { return valid }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, token := authDaemon(t, tc.tenant)
			// Without the replay cache, so that every request asks idemd and hears its answer.
			c, err := idem.New(d.URL, idem.WithToken(tc.token(token)), idem.WithRetries(0), idem.WithReplayCache(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			var failedOpen atomic.Int32
			var inc incidents
			h := &orders{}
			url := serveWith(t, c, h, idem.WithFailOpen(func(*http.Request, error) { failedOpen.Add(1) }), inc.option())
			key := freshKey("charge")
			for range 12 {
				r := call{key: key, body: `{"amount":1}`}.do(t, url)
				if r.status != 201 && (r.status != 503 || r.problemCode() != "idempotency_unavailable" || r.header.Get("Retry-After") == "") {
					t.Fatalf("answer: %+v", r)
				}
			}
			if n := h.runs.Load(); n > 1 || failedOpen.Load() != 0 || inc.count(idem.IncidentFailOpen) != 0 || inc.count(idem.IncidentIdemdRefused) < 10 {
				t.Fatalf("12 requests with one key ran the handler %d times; fail-open reported %d; incidents %v", n, failedOpen.Load(), &inc)
			}
		})
	}
}

// C7: a tenant at its quota of stored keys is refused new keys, even with fail-open,
// while the keys it stored still replay.
func TestMiddlewareAtTheTenantsQuota(t *testing.T) {
	d, token := authDaemon(t, "{max_records: 1}")
	c, err := idem.New(d.URL, idem.WithToken(token), idem.WithRetries(0), idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var failedOpen atomic.Int32
	var inc incidents
	h := &orders{}
	url := serveWith(t, c, h, idem.WithFailOpen(func(*http.Request, error) { failedOpen.Add(1) }), inc.option())
	kept := freshKey("charge")
	if r := (call{key: kept, body: `{"amount":1}`}).do(t, url); r.status != 201 {
		t.Fatalf("the first key: %+v", r)
	}
	r := call{key: freshKey("charge"), body: `{"amount":2}`}.do(t, url)
	if r.status != 503 || r.problemCode() != "idempotency_quota_exceeded" || r.header.Get("Retry-After") == "" {
		t.Fatalf("a new key at the quota: %+v, want 503 idempotency_quota_exceeded with Retry-After", r)
	}
	if n := h.runs.Load(); n != 1 || failedOpen.Load() != 0 || inc.count(idem.IncidentQuotaExceeded) != 1 {
		t.Fatalf("the handler ran %d times, fail-open %d; incidents %v", n, failedOpen.Load(), &inc)
	}
	if r := (call{key: kept, body: `{"amount":1}`}).do(t, url); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("the stored key at the quota: %+v, want its replay", r)
	}
	var p *idem.Problem
	if _, err := c.Claim(t.Context(), freshKey("direct"), idem.ClaimOptions{}); !errors.Is(err, idem.ErrQuotaExceeded) || !errors.As(err, &p) || p.Status != 429 {
		t.Fatalf("a claim at the quota: %v, want ErrQuotaExceeded with status 429", err)
	}
}

func TestMiddlewareWhenIdemdIsDown(t *testing.T) {
	d := ownDaemon(t)
	c, err := idem.New(d.URL, idem.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	var inc incidents
	closed := &orders{}
	closedURL := serveWith(t, c, closed, inc.option())
	var reported atomic.Int32
	open := &orders{}
	openURL := serveWith(t, c, open, idem.WithFailOpen(func(*http.Request, error) { reported.Add(1) }), inc.option())
	d.Kill()

	if r := send(t, closedURL, "POST", freshKey("down"), "application/json", `{}`); r.status != 503 || r.header.Get("Retry-After") == "" || r.problemCode() != "idempotency_unavailable" {
		t.Fatalf("fail closed: %+v", r)
	}
	if n := closed.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times without idemd", n)
	}
	if r := send(t, openURL, "POST", freshKey("down"), "application/json", `{}`); r.status != 201 {
		t.Fatalf("fail open: %+v", r)
	}
	if open.runs.Load() != 1 || reported.Load() != 1 || inc.count(idem.IncidentUnavailable) != 1 || inc.count(idem.IncidentFailOpen) != 1 {
		t.Fatalf("fail open ran the handler %d times and reported %d; incidents %v", open.runs.Load(), reported.Load(), &inc)
	}
}

// Finding 6: the recorder knows HTTP: informational answers, flushing, hijacking and
// protocol switches.
func TestMiddlewareRecorder(t *testing.T) {
	t.Run("103 Early Hints before the answer", func(t *testing.T) {
		var runs atomic.Int32
		url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, "created")
		}))
		key := freshKey("mw-103")
		first := call{key: key, body: `{}`}.do(t, url)
		second := call{key: key, body: `{}`}.do(t, url)
		if first.status != 201 || second.status != 201 || second.body != "created" || !second.replayed() || runs.Load() != 1 {
			t.Fatalf("first %+v, replay %+v, %d runs", first, second, runs.Load())
		}
	})

	t.Run("a streaming handler flushes through", func(t *testing.T) {
		clientRead := make(chan struct{})
		url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, ok := w.(http.Flusher)
			if !ok {
				http.Error(w, "no http.Flusher", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: 1\n\n")
			f.Flush()
			select {
			case <-clientRead:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "data: 2\n\n")
		}))
		key := freshKey("mw-stream")
		req, _ := http.NewRequest(http.MethodPost, url+"/events", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-User", "alice")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if resp.StatusCode != 200 || line != "data: 1\n" {
			resp.Body.Close()
			t.Fatalf("first event: %d %q %v", resp.StatusCode, line, err)
		}
		close(clientRead)
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		if string(rest) != "\ndata: 2\n\n" {
			t.Fatalf("rest of the stream: %q", rest)
		}
		replay := call{path: "/events", key: key, body: `{}`}.do(t, url)
		if replay.status != 200 || replay.body != "data: 1\n\ndata: 2\n\n" || !replay.replayed() {
			t.Fatalf("replay of the stream: %+v", replay)
		}
	})

	t.Run("a hijacked connection is not an empty 200", func(t *testing.T) {
		var runs atomic.Int32
		var inc incidents
		url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer conn.Close()
			fmt.Fprint(buf, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			_ = buf.Flush()
		}), inc.option())
		key := freshKey("mw-hijack")
		first := call{key: key, body: `{}`}.do(t, url)
		if first.status != 201 || first.body != "ok" {
			t.Fatalf("first: %+v", first)
		}
		// The client has its answer before the handler returns: wait for the middleware.
		testenv.WaitFor(t, 10*time.Second, "the result_not_stored incident", func() bool { return inc.count(idem.IncidentResultNotStored) == 1 })
		second := call{key: key, body: `{}`}.do(t, url)
		if second.status != 409 || second.problemCode() != "response_not_stored" || !second.replayed() || runs.Load() != 1 {
			t.Fatalf("retry after a hijacked answer: %+v, %d runs", second, runs.Load())
		}
	})

	t.Run("a result too large to store", func(t *testing.T) {
		var runs atomic.Int32
		var inc incidents
		big := strings.Repeat("x", 4096)
		url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, big)
		}), idem.WithMaxStoredBytes(1024), inc.option())
		key := freshKey("mw-big")
		first := call{key: key, body: `{}`}.do(t, url)
		second := call{key: key, body: `{}`}.do(t, url)
		if first.status != 201 || first.body != big {
			t.Fatalf("first: %d, %d bytes", first.status, len(first.body))
		}
		if second.status != 409 || second.problemCode() != "response_not_stored" || !second.replayed() || runs.Load() != 1 {
			t.Fatalf("retry after a result too large: %+v, %d runs", second, runs.Load())
		}
		testenv.WaitFor(t, 10*time.Second, "the result_not_stored incident", func() bool { return inc.count(idem.IncidentResultNotStored) == 1 })
	})
}

// Finding 7: only allow-listed headers are stored, compared without regard to case,
// and never cookies, hop-by-hop or framing headers, whatever a record holds.
func TestMiddlewareStoredHeaders(t *testing.T) {
	c := newClient(t)
	for _, name := range []string{"set-cookie", "Set-Cookie", "SET-COOKIE", "Transfer-Encoding", "connection", "Content-Length", "upgrade", "Idempotent-Replayed"} {
		mustPanic(t, "WithStoredHeaders("+name+")", func() {
			idem.Middleware(c, idem.WithScope(byUser), idem.WithStoredHeaders("Content-Type", name))
		})
	}

	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["x-trace-id"] = []string{"t-1"} // a name not in canonical form
		w.Header().Set("Location", "/orders/1")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "created")
	})
	url := serve(t, h, idem.WithStoredHeaders("LOCATION", "X-Trace-ID"))
	key := freshKey("mw-headers")
	call{key: key, body: `{}`}.do(t, url)
	r := call{key: key, body: `{}`}.do(t, url)
	if !r.replayed() || r.header.Get("Location") != "/orders/1" || r.header.Get("X-Trace-Id") != "t-1" || r.header.Get("Content-Type") == "text/plain" {
		t.Fatalf("replay with an allow-list in other cases: %+v", r)
	}

	// A record written by something else is replayed without its unsafe headers.
	key = freshKey("mw-foreign")
	probe := httptest.NewRequest(http.MethodPost, "/orders", nil)
	probe.Header.Set("Content-Type", "application/json")
	fp := idem.Fingerprint(probe, []byte(`{}`))
	ctx := t.Context()
	idemdKey := idem.MiddlewareKey("alice", key)
	cl, err := c.Claim(ctx, idemdKey, idem.ClaimOptions{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Complete(ctx, idemdKey, cl.Token, idem.Response{Status: 201, Body: []byte("stored"), Header: http.Header{
		"set-cookie":        {"session=someone-else"},
		"Transfer-Encoding": {"chunked"},
		"Connection":        {"close"},
		"Content-Length":    {"999"},
		"content-type":      {"text/plain"},
	}})
	var p *idem.Problem
	if errors.As(err, &p) && p.Status == 400 {
		t.Logf("idemd refuses such headers itself: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	r = call{key: key, body: `{}`}.do(t, url)
	if r.status != 201 || r.body != "stored" || !r.replayed() || r.header.Get("Set-Cookie") != "" ||
		r.header.Get("Content-Length") != "6" || r.header.Get("Connection") == "close" || r.header.Get("Content-Type") != "text/plain" {
		t.Fatalf("replay of a foreign record: %+v", r)
	}
}

// A stored protocol switch or informational status is never replayed: it would hang
// the client.
func TestMiddlewareNeverReplaysA1xx(t *testing.T) {
	c := newClient(t)
	var inc incidents
	url := serve(t, &orders{}, inc.option())
	key := freshKey("mw-101")
	probe := httptest.NewRequest(http.MethodPost, "/orders", nil)
	probe.Header.Set("Content-Type", "application/json")
	idemdKey := idem.MiddlewareKey("alice", key)
	cl, err := c.Claim(t.Context(), idemdKey, idem.ClaimOptions{Fingerprint: idem.Fingerprint(probe, []byte(`{}`))})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Complete(t.Context(), idemdKey, cl.Token, idem.Response{Status: 101, Header: http.Header{"Upgrade": {"websocket"}}})
	var p *idem.Problem
	if errors.As(err, &p) && p.Status == 400 {
		t.Logf("idemd refuses a stored 101 itself: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	r := call{key: key, body: `{}`}.do(t, url)
	if r.status != 502 || r.problemCode() != "stored_response_invalid" || inc.count(idem.IncidentReplayInvalid) != 1 {
		t.Fatalf("replay of a stored 101: %+v, incidents %v", r, &inc)
	}
}

// Finding 8: every broken promise reaches the incident hook.
func TestMiddlewareIncidents(t *testing.T) {
	t.Run("the result cannot be stored", func(t *testing.T) {
		d := ownDaemon(t)
		c, err := idem.New(d.URL, idem.WithRetries(0))
		if err != nil {
			t.Fatal(err)
		}
		var inc incidents
		url := serveWith(t, c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d.Kill() // idemd goes away while the handler runs
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, "charged")
		}), inc.option())
		r := call{key: freshKey("mw-lost"), body: `{}`}.do(t, url)
		if r.status != 201 || r.body != "charged" {
			t.Fatalf("answer: %+v", r)
		}
		testenv.WaitFor(t, 10*time.Second, "the complete_failed incident", func() bool { return inc.count(idem.IncidentCompleteFailed) == 1 })
	})

	t.Run("the key cannot be released", func(t *testing.T) {
		d := ownDaemon(t)
		c, err := idem.New(d.URL, idem.WithRetries(0))
		if err != nil {
			t.Fatal(err)
		}
		var inc incidents
		url := serveWith(t, c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d.Kill()
			w.WriteHeader(http.StatusServiceUnavailable)
		}), inc.option())
		if r := (call{key: freshKey("mw-release"), body: `{}`}).do(t, url); r.status != 503 {
			t.Fatalf("answer: %+v", r)
		}
		testenv.WaitFor(t, 10*time.Second, "the release_failed incident", func() bool { return inc.count(idem.IncidentReleaseFailed) == 1 })
	})

	t.Run("the lease is lost while the handler runs", func(t *testing.T) {
		c := newClient(t)
		var inc incidents
		key := freshKey("mw-lease")
		url := serveWith(t, c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// An operator purges the key; the next renewal finds the lease gone. The lease
			// is long enough for that renewal to be answered before the lease's deadline,
			// even on a busy machine: this row is idemd's answer, not the expiry.
			if err := c.Purge(context.WithoutCancel(r.Context()), idem.MiddlewareKey("alice", key)); err != nil {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			<-r.Context().Done()
		}), idem.WithLease(time.Second), inc.option())
		r := call{key: key, body: `{}`}.do(t, url)
		if r.status != 409 || r.problemCode() != "lease_lost" || r.header.Get("Retry-After") == "" {
			t.Fatalf("answer: %+v", r)
		}
		testenv.WaitFor(t, 10*time.Second, "the lease_lost incident", func() bool { return inc.count(idem.IncidentLeaseLost) == 1 })
	})

	t.Run("the lease runs out while idemd cannot be reached", func(t *testing.T) {
		c, link := stalledHolder(t)
		var inc incidents
		causes := make(chan error, 1)
		url := serveWith(t, c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The link to idemd is cut: no renewal is answered, and the lease's
			// deadline passes with the handler still running.
			link.cut.Store(true)
			select {
			case <-r.Context().Done():
				causes <- context.Cause(r.Context())
			case <-time.After(testenv.Scale(30 * time.Second)):
				causes <- errors.New("the handler's context was not cancelled")
			}
		}), idem.WithLease(300*time.Millisecond), inc.option())
		r := call{key: freshKey("mw-expired"), body: `{}`}.do(t, url)
		if r.status != 409 || r.problemCode() != "lease_lost" || r.header.Get("Retry-After") != "1" {
			t.Fatalf("answer: %+v", r)
		}
		if cause := <-causes; !errors.Is(cause, idem.ErrLeaseExpired) || !errors.Is(cause, idem.ErrLeaseLost) {
			t.Fatalf("the handler's context ended with %v, want ErrLeaseExpired", cause)
		}
		testenv.WaitFor(t, 10*time.Second, "the lease_expired incident", func() bool { return inc.count(idem.IncidentLeaseExpired) == 1 })
		if n := inc.count(idem.IncidentLeaseLost); n != 0 {
			t.Fatalf("%d lease_lost incidents for a lease that ran out unanswered", n)
		}
	})
}

// A client pointed at something that is not idemd (a wrong base URL, a catch-all
// route) hears successes that are not claim answers: nothing may run on them, fail-open
// or not, since they hold for every retry.
func TestNothingRunsOnASuccessThatIsNotAClaimAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
	}{
		{"200 that is no finished claim", http.StatusOK, `{"status":"ok"}`},
		{"201 that holds no lease", http.StatusCreated, `{"id":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			t.Cleanup(other.Close)
			c, err := idem.New(other.URL, idem.WithRetries(0))
			if err != nil {
				t.Fatal(err)
			}
			var inc incidents
			h := &orders{}
			url := serveWith(t, c, h, idem.WithFailOpen(nil), inc.option())
			key := freshKey("not-idemd")
			for range 3 {
				if r := (call{key: key, body: `{"amount":1}`}).do(t, url); r.status != 503 || r.problemCode() != "idempotency_unavailable" {
					t.Fatalf("answer: %+v", r)
				}
			}
			if n := h.runs.Load(); n != 0 || inc.count(idem.IncidentIdemdRefused) != 3 {
				t.Fatalf("the handler ran %d times; incidents %v", n, &inc)
			}
			var runs atomic.Int32
			if _, err := c.Do(t.Context(), key, "", func(context.Context) (idem.Response, error) {
				runs.Add(1)
				return idem.Response{Status: 200}, nil
			}); err == nil || runs.Load() != 0 {
				t.Fatalf("Do: %v, fn ran %d times; want an error and no run", err, runs.Load())
			}
		})
	}
}

// A wait or lease that idemd refuses on every claim cannot build a middleware: every
// request would otherwise answer 503.
func TestMiddlewareRefusesLimitsIdemdRefuses(t *testing.T) {
	c := newClient(t)
	scope := idem.WithScope(func(*http.Request) string { return "u" })
	mustPanic(t, "WithWait(31s)", func() { idem.Middleware(c, scope, idem.WithWait(31*time.Second)) })
	mustPanic(t, "WithWait(-1s)", func() { idem.Middleware(c, scope, idem.WithWait(-time.Second)) })
	mustPanic(t, "WithLease(50ms)", func() { idem.Middleware(c, scope, idem.WithLease(50*time.Millisecond)) })
	mustPanic(t, "WithLease(2h)", func() { idem.Middleware(c, scope, idem.WithLease(2*time.Hour)) })
	// The bounds themselves are allowed.
	idem.Middleware(c, scope, idem.WithWait(30*time.Second), idem.WithLease(time.Hour))
	idem.Middleware(c, scope, idem.WithWait(0), idem.WithLease(100*time.Millisecond))
}

// TestMiddlewareKeyPrefix: with WithKeyPrefix the idemd key of a request is the prefix
// and then the derived key: the handler's lease, incidents and Lookup see that full
// key, the feed lists it under the prefix, and replays work as without it. A prefix
// that would make keys too long, or is not UTF-8, is refused when the middleware is
// made.
func TestMiddlewareKeyPrefix(t *testing.T) {
	c := newClient(t)
	prefix := freshKey("orders") + "/"
	var leaseKey string
	var inc incidents
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, _ := idem.LeaseFrom(r.Context())
		leaseKey = l.Key
		w.WriteHeader(http.StatusCreated)
		if r.URL.Path == "/big" {
			fmt.Fprint(w, strings.Repeat("x", 64))
			return
		}
		fmt.Fprint(w, "made")
	})
	url := serveWith(t, c, h, idem.WithKeyPrefix(prefix), idem.WithMaxStoredBytes(32), inc.option())
	key := freshKey("mw-prefix")
	full := prefix + idem.MiddlewareKey("alice", key)

	if r := (call{key: key, body: `{}`}).do(t, url); r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("the first request: %+v", r)
	}
	if leaseKey != full {
		t.Fatalf("the handler's lease is on %q, want %q", leaseKey, full)
	}
	rec, err := c.Lookup(t.Context(), full)
	if err != nil || rec.State != "completed" || string(rec.Response.Body) != "made" {
		t.Fatalf("lookup of the full key: %+v %v", rec, err)
	}
	if _, err := c.Lookup(t.Context(), idem.MiddlewareKey("alice", key)); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("lookup of the key without the prefix: %v, want ErrNotFound", err)
	}
	if r := (call{key: key, body: `{}`}).do(t, url); r.status != http.StatusCreated || !r.replayed() || r.body != "made" {
		t.Fatalf("the repeated request: %+v, want the replay", r)
	}

	// A request that holds its key past its lease (its handler never returns in time)
	// shows in the feed under the prefix.
	held, err := c.Claim(t.Context(), prefix+"left-behind", idem.ClaimOptions{Lease: 150 * time.Millisecond})
	if err != nil || held.Outcome != idem.Acquired {
		t.Fatal(held, err)
	}
	waitAbandoned(t, c, prefix, prefix+"left-behind")

	// An incident names the full key too: an answer over the stored limit.
	big := freshKey("mw-prefix-big")
	if r := (call{path: "/big", key: big, body: `{}`}).do(t, url); r.status != http.StatusCreated {
		t.Fatalf("the large answer: %+v", r)
	}
	testenv.WaitFor(t, 10*time.Second, "the result_not_stored incident", func() bool { return inc.count(idem.IncidentResultNotStored) == 1 })
	inc.mu.Lock()
	got := inc.seen[len(inc.seen)-1].IdemdKey
	inc.mu.Unlock()
	if want := prefix + idem.MiddlewareKey("alice", big); got != want || leaseKey != want {
		t.Fatalf("the incident names %q and the lease was on %q, want %q", got, leaseKey, want)
	}

	scope := idem.WithScope(byUser)
	longest := strings.Repeat("p", 255-len(idem.MiddlewareKey("a", "b")))
	idem.Middleware(c, scope, idem.WithKeyPrefix(longest))
	mustPanic(t, "a prefix one byte too long", func() { idem.Middleware(c, scope, idem.WithKeyPrefix(longest+"p")) })
	mustPanic(t, "a prefix that is not UTF-8", func() { idem.Middleware(c, scope, idem.WithKeyPrefix("orders\xff/")) })
}
