package server_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testredis"
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
	srv := server.New(engine.NewService(store, time.Hour, opts...), server.Config{
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
