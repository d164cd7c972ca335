package server_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// The tokens of the test auth file. alpha and beta are two teams; limited has small
// limits of every kind.
const (
	alphaUse     = "alpha-use-token"
	alphaAdmin   = "alpha-admin-token"
	betaUse      = "beta-use-token"
	betaAdmin    = "beta-admin-token"
	limitedUse   = "limited-use-token"
	alphaOnlyAdm = "alpha-admin-only-token"
)

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func testAuthFile() string {
	return `
tenants:
  alpha: {}
  beta: {}
  limited:
    max_response_bytes: 16
    max_retention: 1h
    rate: 0.05
    burst: 3
tokens:
  - {name: alpha-app, tenant: alpha, scopes: [use], sha256: ` + tokenHash(alphaUse) + `}
  - {name: alpha-ops, tenant: alpha, scopes: [use, admin], sha256: ` + tokenHash(alphaAdmin) + `}
  - {name: alpha-purger, tenant: alpha, scopes: [admin], sha256: ` + tokenHash(alphaOnlyAdm) + `}
  - {name: beta-app, tenant: beta, scopes: [use], sha256: ` + tokenHash(betaUse) + `}
  - {name: beta-ops, tenant: beta, scopes: [use, admin], sha256: ` + tokenHash(betaAdmin) + `}
  - {name: limited-app, tenant: limited, scopes: [use], sha256: ` + tokenHash(limitedUse) + `}
`
}

// lockedBuffer is a log destination that handlers write from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// authDaemon is a real HTTP server with the test auth file over a real Redis.
type authDaemon struct {
	t     *testing.T
	url   string
	redis *testredis.Server
	logs  *lockedBuffer
}

func newAuthDaemon(t *testing.T) *authDaemon {
	t.Helper()
	r := testredis.Start(t)
	store, err := redisstore.Open(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(testAuthFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	srv := server.New(engine.NewService(store, 24*time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{
		Limits: server.Limits{MaxResponseBytes: 1024},
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Auth:   keyring,
	})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &authDaemon{t: t, url: hs.URL, redis: r, logs: logs}
}

type authAnswer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (a authAnswer) str(field string) string { s, _ := a.body[field].(string); return s }

func (a authAnswer) num(field string) int64 { f, _ := a.body[field].(float64); return int64(f) }

// call sends one request with the bearer token (none when token is empty) and a JSON
// body (none when body is nil).
func (d *authDaemon) call(token, method, path string, body any) authAnswer {
	d.t.Helper()
	var reader io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			d.t.Fatal(err)
		}
		reader = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, d.url+path, reader)
	if err != nil {
		d.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return d.send(req)
}

func (d *authDaemon) send(req *http.Request) authAnswer {
	d.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	a := authAnswer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 && strings.Contains(resp.Header.Get("Content-Type"), "json") {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			d.t.Fatalf("%s %s: answer is not JSON: %q", req.Method, req.URL.Path, raw)
		}
	}
	return a
}

func (d *authDaemon) metrics() string {
	d.t.Helper()
	return d.call("", http.MethodGet, "/metrics", nil).raw
}

func recordPath(key string) string { return "/v1/records/" + url.PathEscape(key) }

func expectStatus(t *testing.T, what string, a authAnswer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: status %d, want %d: %s", what, a.status, status, a.raw)
	}
	if code != "" && (a.str("code") != code || a.header.Get("Content-Type") != "application/problem+json") {
		t.Fatalf("%s: %s (%s), want problem code %q", what, a.raw, a.header.Get("Content-Type"), code)
	}
}

// TestTenantIsolation has two tenants use the same key. Whatever beta sends, even
// alpha's lease token, it never reads or changes alpha's record; and the key is two
// records, one per tenant, in two Redis keys.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	const key = "order-1"
	claim := d.call(alphaUse, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "alpha-payload", "owner": "alpha-worker"})
	expectStatus(t, "alpha claims", claim, http.StatusCreated, "")
	alphaLease := claim.str("lease_token")

	trespass := []struct {
		name   string
		token  string
		method string
		path   string
		body   any
	}{
		{"lookup", betaUse, http.MethodGet, recordPath(key), nil},
		{"complete with alpha's lease token", betaUse, http.MethodPost, "/v1/complete",
			map[string]any{"key": key, "lease_token": alphaLease, "response": map[string]any{"status": 200, "body": "YmV0YQ=="}}},
		{"release for a retry with alpha's lease token", betaUse, http.MethodPost, "/v1/release",
			map[string]any{"key": key, "lease_token": alphaLease, "mode": "retry"}},
		{"release as failed with alpha's lease token", betaUse, http.MethodPost, "/v1/release",
			map[string]any{"key": key, "lease_token": alphaLease, "mode": "fail"}},
		{"extend with alpha's lease token", betaUse, http.MethodPost, "/v1/extend",
			map[string]any{"key": key, "lease_token": alphaLease, "lease_ms": 60000}},
		{"purge", betaAdmin, http.MethodDelete, recordPath(key), nil},
	}
	for _, tt := range trespass {
		t.Run("beta cannot "+tt.name, func(t *testing.T) {
			expectStatus(t, tt.name, d.call(tt.token, tt.method, tt.path, tt.body), http.StatusNotFound, "not_found")
			rec := d.call(alphaUse, http.MethodGet, recordPath(key), nil)
			expectStatus(t, "alpha looks up", rec, http.StatusOK, "")
			if rec.str("state") != "pending" || rec.num("attempt") != 1 || rec.str("fingerprint") != "alpha-payload" {
				t.Fatalf("alpha's record changed: %s", rec.raw)
			}
		})
	}

	// The same key in beta is a record of its own: a different fingerprint is no
	// mismatch, and beta acquires at attempt 1 while alpha still holds its lease.
	betaClaim := d.call(betaUse, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "beta-payload"})
	expectStatus(t, "beta claims the same key", betaClaim, http.StatusCreated, "")
	if betaClaim.num("attempt") != 1 || betaClaim.str("lease_token") == alphaLease {
		t.Fatalf("beta's claim: %s", betaClaim.raw)
	}
	betaLease := betaClaim.str("lease_token")

	// Each lease token works only in its own tenant, also in the other direction.
	expectStatus(t, "alpha extends with beta's token", d.call(alphaUse, http.MethodPost, "/v1/extend",
		map[string]any{"key": key, "lease_token": betaLease, "lease_ms": 60000}), http.StatusConflict, "lease_lost")
	expectStatus(t, "alpha extends", d.call(alphaUse, http.MethodPost, "/v1/extend",
		map[string]any{"key": key, "lease_token": alphaLease, "lease_ms": 60000}), http.StatusOK, "")

	for _, who := range []struct {
		token, lease, body string
	}{{alphaUse, alphaLease, "YWxwaGE="}, {betaUse, betaLease, "YmV0YQ=="}} {
		done := d.call(who.token, http.MethodPost, "/v1/complete",
			map[string]any{"key": key, "lease_token": who.lease, "response": map[string]any{"status": 201, "body": who.body}})
		expectStatus(t, "complete", done, http.StatusOK, "")
	}
	for _, who := range []struct{ token, fingerprint, body string }{
		{alphaUse, "alpha-payload", "YWxwaGE="}, {betaUse, "beta-payload", "YmV0YQ=="},
	} {
		replay := d.call(who.token, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": who.fingerprint})
		expectStatus(t, "replay", replay, http.StatusOK, "")
		resp, _ := replay.body["response"].(map[string]any)
		if replay.str("outcome") != "completed" || resp["body"] != who.body {
			t.Fatalf("replay for %s: %s, want its own body %s", who.fingerprint, replay.raw, who.body)
		}
	}

	for _, tenant := range []string{"alpha", "beta"} {
		redisKey := redisstore.RecordKey(engine.ID{Tenant: tenant, Key: key})
		if n, err := d.redis.Command("EXISTS", redisKey); err != nil || n != ":1" {
			t.Fatalf("EXISTS %s = %q, %v; want one Redis key per tenant", redisKey, n, err)
		}
	}

	expectStatus(t, "alpha purges", d.call(alphaAdmin, http.MethodDelete, recordPath(key), nil), http.StatusNoContent, "")
	expectStatus(t, "alpha after its purge", d.call(alphaUse, http.MethodGet, recordPath(key), nil), http.StatusNotFound, "not_found")
	rec := d.call(betaUse, http.MethodGet, recordPath(key), nil)
	expectStatus(t, "beta after alpha's purge", rec, http.StatusOK, "")
	if rec.str("state") != "completed" {
		t.Fatalf("beta's record after alpha's purge: %s", rec.raw)
	}
}

// TestAuthentication checks who gets in, over every API route.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	key := "auth-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	routes := []struct {
		method, path string
		body         any
		scope        auth.Scope
	}{
		{http.MethodPost, "/v1/claim", map[string]any{"key": key}, auth.ScopeUse},
		{http.MethodPost, "/v1/complete", map[string]any{"key": key, "lease_token": "x", "response": map[string]any{"status": 200}}, auth.ScopeUse},
		{http.MethodPost, "/v1/release", map[string]any{"key": key, "lease_token": "x", "mode": "retry"}, auth.ScopeUse},
		{http.MethodPost, "/v1/extend", map[string]any{"key": key, "lease_token": "x", "lease_ms": 1000}, auth.ScopeUse},
		{http.MethodGet, recordPath(key), nil, auth.ScopeUse},
		{http.MethodDelete, recordPath(key), nil, auth.ScopeAdmin},
	}
	for _, r := range routes {
		name := r.method + " " + r.path
		t.Run(name+" without a token is 401 with a challenge", func(t *testing.T) {
			a := d.call("", r.method, r.path, r.body)
			expectStatus(t, name, a, http.StatusUnauthorized, "unauthenticated")
			if ch := a.header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer") {
				t.Fatalf("WWW-Authenticate = %q", ch)
			}
		})
		t.Run(name+" with an unknown token is 401 invalid_token", func(t *testing.T) {
			a := d.call("not-a-token", r.method, r.path, r.body)
			expectStatus(t, name, a, http.StatusUnauthorized, "unauthenticated")
			if ch := a.header.Get("WWW-Authenticate"); !strings.Contains(ch, `error="invalid_token"`) {
				t.Fatalf("WWW-Authenticate = %q", ch)
			}
		})
		wrong := alphaOnlyAdm
		if r.scope == auth.ScopeAdmin {
			wrong = alphaUse
		}
		t.Run(name+" without its scope is 403", func(t *testing.T) {
			expectStatus(t, name, d.call(wrong, r.method, r.path, r.body), http.StatusForbidden, "forbidden")
		})
		t.Run(name+" with its scope passes authentication", func(t *testing.T) {
			a := d.call(alphaAdmin, r.method, r.path, r.body)
			if a.status == http.StatusUnauthorized || a.status == http.StatusForbidden {
				t.Fatalf("%s with a use+admin token: %d %s", name, a.status, a.raw)
			}
		})
	}

	t.Run("a Basic header is 401", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, d.url+recordPath(key), nil)
		req.SetBasicAuth("alpha", alphaUse)
		expectStatus(t, "basic", d.send(req), http.StatusUnauthorized, "unauthenticated")
	})
	t.Run("the scheme name is case-insensitive", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, d.url+recordPath(key), nil)
		req.Header.Set("Authorization", "bearer "+alphaUse)
		if a := d.send(req); a.status == http.StatusUnauthorized {
			t.Fatalf("lower-case bearer: %d %s", a.status, a.raw)
		}
	})
	t.Run("the token's hash is not a token", func(t *testing.T) {
		expectStatus(t, "hash", d.call(tokenHash(alphaUse), http.MethodGet, recordPath(key), nil), http.StatusUnauthorized, "unauthenticated")
	})
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		t.Run(path+" is open", func(t *testing.T) {
			if a := d.call("", http.MethodGet, path, nil); a.status != http.StatusOK {
				t.Fatalf("%s without a token: %d %s", path, a.status, a.raw)
			}
		})
	}

	metrics := d.metrics()
	for _, want := range []string{
		`idemd_auth_failures_total{reason="missing"} 6`,
		`idemd_auth_failures_total{reason="unknown"} 7`,
		`idemd_auth_failures_total{reason="malformed"} 1`,
		`idemd_auth_failures_total{reason="forbidden"} 6`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="unauthenticated",tenant="-"} 2`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="forbidden",tenant="alpha"} 1`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="acquired",tenant="alpha"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	logs := d.logs.String()
	if !strings.Contains(logs, `"reason":"unknown"`) || !strings.Contains(logs, `"reason":"forbidden"`) {
		t.Errorf("refusals are not logged with their reason:\n%s", logs)
	}
	for _, secret := range []string{alphaUse, alphaOnlyAdm, "not-a-token", tokenHash(alphaUse)} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs contain a presented token %q", secret)
		}
	}
}

// TestTenantLimits checks the limits of the limited tenant, and that they are its own.
func TestTenantLimits(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	expectAllowed := func(what string, a authAnswer, status int) {
		t.Helper()
		expectStatus(t, what, a, status, "")
	}

	// Three requests of burst: a claim, a completion that is too large, and one more.
	claim := d.call(limitedUse, http.MethodPost, "/v1/claim", map[string]any{"key": "k", "lease_ms": 1000})
	expectAllowed("claim", claim, http.StatusCreated)
	rec := d.call(alphaUse, http.MethodPost, "/v1/claim", map[string]any{"key": "k", "lease_ms": 1000})
	expectAllowed("alpha claims", rec, http.StatusCreated)
	lease := claim.str("lease_token")

	tooBig := d.call(limitedUse, http.MethodPost, "/v1/complete", map[string]any{"key": "k", "lease_token": lease,
		"response": map[string]any{"status": 200, "body": "MDEyMzQ1Njc4OWFiY2RlZmc="}}) // 17 bytes
	expectStatus(t, "a 17-byte response over a 16-byte limit", tooBig, http.StatusRequestEntityTooLarge, "payload_too_large")
	tooLong := d.call(limitedUse, http.MethodPost, "/v1/complete", map[string]any{"key": "k", "lease_token": lease,
		"response": map[string]any{"status": 200}, "retention_ms": 3600001})
	expectStatus(t, "retention over the cap", tooLong, http.StatusBadRequest, "invalid_request")
	if !strings.Contains(tooLong.str("detail"), "retention_ms") {
		t.Fatalf("the refusal does not name retention_ms: %s", tooLong.raw)
	}

	// The burst is spent; at 0.05/s the next token is twenty seconds away.
	limited := d.call(limitedUse, http.MethodGet, recordPath("k"), nil)
	expectStatus(t, "over the rate", limited, http.StatusTooManyRequests, "rate_limited")
	if ra, err := strconv.Atoi(limited.header.Get("Retry-After")); err != nil || ra < 1 || ra > 20 {
		t.Fatalf("Retry-After = %q, want 1 to 20 seconds", limited.header.Get("Retry-After"))
	}
	if limited.num("retry_after_ms") <= 0 {
		t.Fatalf("429 without retry_after_ms: %s", limited.raw)
	}
	if !strings.Contains(d.metrics(), `idemd_requests_total{endpoint="GET /v1/records/:key",outcome="rate_limited",tenant="limited"} 1`+"\n") {
		t.Error("the 429 is not counted for the limited tenant")
	}

	// Other tenants keep their own limits: alpha stores 17 bytes for 2 hours and is not
	// rate limited.
	done := d.call(alphaUse, http.MethodPost, "/v1/complete", map[string]any{"key": "k", "lease_token": rec.str("lease_token"),
		"response": map[string]any{"status": 200, "body": "MDEyMzQ1Njc4OWFiY2RlZmc="}, "retention_ms": 7200000})
	expectAllowed("alpha completes", done, http.StatusOK)
	for i := range 5 {
		expectAllowed("alpha looks up "+strconv.Itoa(i), d.call(alphaUse, http.MethodGet, recordPath("k"), nil), http.StatusOK)
	}
}

// TestTenantRetentionClamp checks that without retention_ms a capped tenant's records
// are kept no longer than its cap, pending and completed alike.
func TestTenantRetentionClamp(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	expiresWithin := func(what string, a authAnswer, limit time.Duration) {
		t.Helper()
		exp, err := time.Parse(time.RFC3339Nano, a.str("expires_at"))
		if err != nil {
			t.Fatalf("%s: expires_at: %v in %s", what, err, a.raw)
		}
		if until := time.Until(exp); until > limit+time.Minute || until < limit-time.Minute {
			t.Fatalf("%s: expires in %s, want about %s", what, until, limit)
		}
	}
	claim := d.call(limitedUse, http.MethodPost, "/v1/claim", map[string]any{"key": "clamped"})
	expectStatus(t, "claim", claim, http.StatusCreated, "")
	pending := d.call(limitedUse, http.MethodGet, recordPath("clamped"), nil)
	expectStatus(t, "lookup", pending, http.StatusOK, "")
	expiresWithin("pending record", pending, time.Hour)
	done := d.call(limitedUse, http.MethodPost, "/v1/complete", map[string]any{"key": "clamped",
		"lease_token": claim.str("lease_token"), "response": map[string]any{"status": 204}})
	expectStatus(t, "complete", done, http.StatusOK, "")
	expiresWithin("completed record", done, time.Hour)

	claim = d.call(alphaUse, http.MethodPost, "/v1/claim", map[string]any{"key": "clamped"})
	done = d.call(alphaUse, http.MethodPost, "/v1/complete", map[string]any{"key": "clamped",
		"lease_token": claim.str("lease_token"), "response": map[string]any{"status": 204}})
	expectStatus(t, "alpha completes", done, http.StatusOK, "")
	expiresWithin("a record of a tenant without a cap", done, 24*time.Hour)
}
