package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// metricsText is the daemon's /metrics page.
func (d *daemon) metricsText() string {
	d.t.Helper()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	return string(b)
}

// TestMetricLabelsAreBounded sends requests with made-up methods and paths: none of
// them may become a label value, or any client could grow the metrics without bound.
func TestMetricLabelsAreBounded(t *testing.T) {
	d, _ := redisDaemon(t)
	for _, path := range []string{"/healthz", "/v1/claim", "/v1/records/k", "/nowhere-M0000042"} {
		for _, method := range []string{"M0000042", "PROPFIND", http.MethodPatch} {
			d.do(method, path, "", nil)
		}
	}
	d.do(http.MethodGet, "/healthz", "", nil)
	text := d.metricsText()
	for _, bad := range []string{"M0000042", "PROPFIND", "PATCH", "nowhere"} {
		if strings.Contains(text, bad) {
			t.Errorf("a client-chosen %q became a label value", bad)
		}
	}
	for _, want := range []string{
		`idemd_requests_total{endpoint="other",outcome="method_not_allowed"`,
		`idemd_requests_total{endpoint="other",outcome="not_found"`,
		`idemd_requests_total{endpoint="GET /healthz",outcome="ok",tenant="-"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// newDaemonWith is newDaemon with service options and a log of its own.
func newDaemonWith(t testing.TB, store engine.Store, log io.Writer, opts ...engine.Option) *daemon {
	t.Helper()
	srv := server.New(engine.NewService(store, time.Hour, append([]engine.Option{engine.WithStoreTimeout(time.Minute)}, opts...)...), server.Config{
		Limits: server.Limits{MaxResponseBytes: 1024},
		Logger: slog.New(slog.NewTextHandler(log, nil)),
	})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &daemon{t: t, url: hs.URL}
}

// frozenRedis starts a Redis that the test can stop with SIGSTOP; it is always let go
// again (SIGCONT) before it is killed.
func frozenRedis(t *testing.T) (*testredis.Server, *redisstore.Store) {
	t.Helper()
	r := testredis.Start(t)
	t.Cleanup(r.Resume)
	store, err := redisstore.Open(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return r, store
}

// TestFrozenStoreAnswersAtItsDeadline stops Redis's process: claims and /readyz must
// answer 503 once the store deadline passes, saying so, instead of waiting out
// go-redis's own timeouts and retries (which took 15 s and more, longer than the
// SDK's timeout). Redis then comes back and the daemon serves again.
func TestFrozenStoreAnswersAtItsDeadline(t *testing.T) {
	r, store := frozenRedis(t)
	var log lockedBuffer
	d := newDaemonWith(t, store, &log, engine.WithStoreTimeout(300*time.Millisecond))
	key := freshKey("frozen")
	d.acquire(key + "-before")
	r.Pause()
	for _, a := range []answer{
		d.claim(map[string]any{"key": key}),
		d.post("/v1/complete", map[string]any{"key": key, "lease_token": "t", "response": map[string]any{"status": 200}}),
		d.lookup(key),
		d.do(http.MethodGet, "/readyz", "", nil),
	} {
		wantProblem(t, a, 503, "store_unavailable")
		if !strings.Contains(a.str("detail"), "did not answer within 300ms") {
			t.Errorf("detail %q does not name the store deadline", a.str("detail"))
		}
	}
	if !strings.Contains(d.metricsText(), `idemd_store_errors_total{endpoint="POST /v1/claim"} 1`) {
		t.Error("a frozen store is not counted as a store error")
	}
	r.Resume()
	if err := testredis.WaitReady(r.Addr(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The frozen claim may have been carried out once Redis resumed: a deadline says
	// nothing about whether a write took effect. A new key shows the daemon serves.
	d.acquire(key + "-after")
}

// gate is a TCP proxy in front of Redis that can hold the daemon's commands: while it
// is shut, what the daemon sends waits in the proxy, and arrived says that something
// did. It shows a request inside a store call without guessing how long that takes.
type gate struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	shut    chan struct{} // closed when the gate opens again; nil while open
	arrived chan struct{}
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target, arrived: make(chan struct{}, 1)}
	t.Cleanup(func() { g.open(); _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go g.serve(conn)
		}
	}()
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

func (g *gate) serve(conn net.Conn) {
	defer conn.Close()
	upstream, err := net.Dial("tcp", g.target)
	if err != nil {
		return
	}
	defer upstream.Close()
	go func() { _, _ = io.Copy(conn, upstream); _ = conn.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return
		}
		g.mu.Lock()
		shut := g.shut
		g.mu.Unlock()
		if shut != nil {
			select {
			case g.arrived <- struct{}{}:
			default:
			}
			<-shut
		}
		if _, err := upstream.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestCallerHangingUpIsNotAStoreOutage cancels a claim while its store call is under
// way: the store is fine, so there must be no store error counted, no 503 outcome and
// no warning, and the daemon goes on serving.
func TestCallerHangingUpIsNotAStoreOutage(t *testing.T) {
	r := testredis.Start(t)
	g := newGate(t, r.Addr())
	store, err := redisstore.Open("redis://" + g.addr() + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	var log lockedBuffer
	d := newDaemonWith(t, store, &log, engine.WithStoreTimeout(time.Minute))
	d.acquire(freshKey("hangup-before"))

	g.close()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/claim", strings.NewReader(`{"key":"`+freshKey("hangup")+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	sent := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		sent <- err
	}()
	<-g.arrived // the claim's script is on its way to Redis
	cancel()
	if err := <-sent; err == nil {
		t.Fatal("the cancelled claim got an answer")
	}
	var text string
	wait.For(t, 10*time.Second, "the hung-up claim to be counted", func() bool {
		text = d.metricsText()
		return strings.Contains(text, `idemd_requests_total{endpoint="POST /v1/claim",outcome="client_closed_request"`)
	})
	g.open()
	if !strings.Contains(text, `idemd_requests_total{endpoint="POST /v1/claim",outcome="client_closed_request",tenant="default"} 1`) {
		t.Errorf("the hung-up claim is not counted as client_closed_request:\n%s", grepLines(text, "idemd_requests_total"))
	}
	for _, bad := range []string{"idemd_store_errors_total{", `outcome="store_unavailable"`} {
		if strings.Contains(text, bad) {
			t.Errorf("a caller hanging up shows as a store outage: %s", grepLines(text, bad))
		}
	}
	if strings.Contains(log.String(), "level=WARN") {
		t.Errorf("a caller hanging up was logged as a warning:\n%s", log.String())
	}
	d.acquire(freshKey("hangup-after"))
}

func grepLines(text, substr string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestUnparsableRequestsGetAProblem: requests net/http refuses before any handler,
// such as a path with a malformed percent-escape, are bad input like any other and
// are answered with problem+json, on a daemon serving through server.Listener.
func TestUnparsableRequestsGetAProblem(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	hs := httptest.NewUnstartedServer(server.New(engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{}))
	hs.Listener = server.Listener(hs.Listener)
	hs.Start()
	t.Cleanup(hs.Close)
	for _, tc := range []struct{ request, detail string }{
		{"GET /v1/records/%zz HTTP/1.1\r\nHost: idemd\r\n\r\n", "percent-escape"},
		{"DELETE /v1/records/a%2 HTTP/1.1\r\nHost: idemd\r\n\r\n", "percent-escape"},
		{"GET /v1/records/k HTTP/1.1\r\n\r\n", "Host"},
		{"GET /v1/records/k HTTP/1.1\r\nHost: idemd\r\nBad Header\r\n\r\n", "header"},
	} {
		conn, err := net.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(conn, tc.request)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		a := answer{status: resp.StatusCode, header: resp.Header, raw: body}
		if err := json.Unmarshal(body, &a.body); err != nil {
			t.Errorf("%q: %d %q is not problem+json", tc.request, resp.StatusCode, body)
			continue
		}
		wantProblem(t, a, http.StatusBadRequest, "invalid_request")
		if !strings.Contains(a.str("detail"), tc.detail) {
			t.Errorf("%q: detail %q does not mention %s", tc.request, a.str("detail"), tc.detail)
		}
	}
	// Answers from handlers pass through untouched.
	resp, err := http.Get(hs.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("healthz through the listener: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
