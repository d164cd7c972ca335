package server_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// The console's tokens besides tenant_test.go's: two of a platform team, whose own
// tenant is ops.
const (
	platformAdmin  = "platform-admin-token"
	platformReader = "platform-reader-token"
)

func consoleAuthFile() string {
	return `
tenants:
  alpha: {}
  beta: {}
  ops: {}
tokens:
  - {name: alpha-app, tenant: alpha, scopes: [use], sha256: ` + tokenHash(alphaUse) + `}
  - {name: alpha-ops, tenant: alpha, scopes: [use, admin], sha256: ` + tokenHash(alphaAdmin) + `}
  - {name: beta-app, tenant: beta, scopes: [use], sha256: ` + tokenHash(betaUse) + `}
  - {name: platform-oncall, tenant: ops, scopes: [use, admin, platform], sha256: ` + tokenHash(platformAdmin) + `}
  - {name: platform-viewer, tenant: ops, scopes: [platform, use], sha256: ` + tokenHash(platformReader) + `}
`
}

// consoleStore is the embedded store the console tests run over: the console reads the
// store through the engine, the same whichever store it is.
func consoleStore(t *testing.T) engine.Store {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func redisStoreFor(t *testing.T, r *testredis.Server) *redisstore.Store {
	t.Helper()
	store, err := redisstore.Open(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// newConsoleDaemon is a real idemd with the console on and the console's auth file
// (none when open), over store.
func newConsoleDaemon(t *testing.T, store engine.Store, open bool, info server.StoreInfo) *authDaemon {
	t.Helper()
	logs := &lockedBuffer{}
	cfg := server.Config{
		Limits:  server.Limits{MaxResponseBytes: 4096},
		Logger:  slog.New(slog.NewJSONHandler(logs, nil)),
		Console: server.Console{Enabled: true, Store: info},
	}
	if !open {
		path := filepath.Join(t.TempDir(), "auth.yaml")
		if err := os.WriteFile(path, []byte(consoleAuthFile()), 0o600); err != nil {
			t.Fatal(err)
		}
		keyring, err := auth.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Auth = keyring
	}
	hs := httptest.NewServer(server.New(engine.NewService(store, 24*time.Hour, engine.WithStoreTimeout(time.Minute)), cfg))
	t.Cleanup(hs.Close)
	return &authDaemon{t: t, url: hs.URL, logs: logs}
}

func query(path string, params ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(params); i += 2 {
		v.Add(params[i], params[i+1])
	}
	return path + "?" + v.Encode()
}

// wantConsoleHeaders checks the headers every answer under /console carries.
func wantConsoleHeaders(t *testing.T, what string, a authAnswer) {
	t.Helper()
	want := map[string]string{
		"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
	}
	for name, value := range want {
		if got := a.header.Get(name); got != value {
			t.Errorf("%s: %s is %q, want %q", what, name, got, value)
		}
	}
}

// TestConsoleIsOffByDefault: without the console, everything under /console is not
// found, with a token or without, open or with an auth file: nothing there asks for a
// token as though something were behind it.
func TestConsoleIsOffByDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(consoleAuthFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		auth  server.Authenticator
		token string
	}{
		{"open", nil, ""},
		{"with an auth file, no token", keyring, ""},
		{"with an auth file, an unknown token", keyring, "nobody"},
		{"with an auth file, a platform token", keyring, platformAdmin},
	} {
		hs := httptest.NewServer(server.New(engine.NewService(consoleStore(t), time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{Auth: c.auth}))
		t.Cleanup(hs.Close)
		d := &authDaemon{t: t, url: hs.URL}
		for _, r := range []struct{ method, path string }{
			{http.MethodGet, "/console"}, {http.MethodGet, "/console/"}, {http.MethodGet, "/console/console.js"},
			{http.MethodGet, "/console/api/whoami"}, {http.MethodGet, "/console/api/store"},
			{http.MethodDelete, query("/console/api/records", "key", "k")},
		} {
			a := d.call(c.token, r.method, r.path, nil)
			expectStatus(t, c.name+": "+r.method+" "+r.path, a, http.StatusNotFound, "not_found")
		}
	}
}

// TestConsoleServesItsFiles: the page and its two files come from the binary with the
// security headers, and so does every other answer under /console; the page loads no
// script or style but its own, and builds no markup from strings.
func TestConsoleServesItsFiles(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	for _, f := range []struct{ path, contentType string }{
		{"/console/", "text/html; charset=utf-8"},
		{"/console/console.js", "text/javascript; charset=utf-8"},
		{"/console/console.css", "text/css; charset=utf-8"},
	} {
		a := d.call("", http.MethodGet, f.path, nil)
		expectStatus(t, f.path, a, http.StatusOK, "")
		if got := a.header.Get("Content-Type"); got != f.contentType {
			t.Errorf("%s: Content-Type %q, want %q", f.path, got, f.contentType)
		}
		wantConsoleHeaders(t, f.path, a)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(d.url + "/console")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/console/" {
		t.Errorf("/console: %d to %q, want 301 to /console/", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, path := range []string{"/console/missing.js", "/console/api/nothing"} {
		a := d.call("", http.MethodGet, path, nil)
		expectStatus(t, path, a, http.StatusNotFound, "not_found")
		wantConsoleHeaders(t, path, a)
	}
	a := d.call("", http.MethodGet, "/console/api/whoami", nil)
	expectStatus(t, "whoami without a token", a, http.StatusUnauthorized, "unauthenticated")
	wantConsoleHeaders(t, "whoami without a token", a)

	page := d.call("", http.MethodGet, "/console/", nil).raw
	script := d.call("", http.MethodGet, "/console/console.js", nil).raw
	if n := len(regexp.MustCompile(`<script`).FindAllString(page, -1)); n != 1 || !strings.Contains(page, `<script src="console.js" defer></script>`) {
		t.Errorf("the page has %d script elements; want its one script file and no inline script", n)
	}
	for _, banned := range []string{"style=", "http://", "https://", "<style"} {
		if strings.Contains(page, banned) {
			t.Errorf("the page holds %q: inline style or something fetched from elsewhere", banned)
		}
	}
	// The only URL in the script is SVG's namespace, which names and fetches nothing.
	for _, banned := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "https://"} {
		if strings.Contains(script, banned) {
			t.Errorf("the script uses %q", banned)
		}
	}
	if n := server.ConsoleAssetBytes(); n > 64<<10 {
		t.Errorf("the console's files are %d bytes; docs/console.md says they are small", n)
	}
}

// TestConsoleAccess calls what the page calls with each kind of token: a token without
// platform never reaches another tenant, whatever it names; purging needs admin, and
// platform for another tenant; every purge is logged with who did it.
func TestConsoleAccess(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	seed := func(token, key string) {
		t.Helper()
		a := d.call(token, http.MethodPost, "/v1/claim", map[string]any{"key": key, "owner": "seeder"})
		expectStatus(t, "claim "+key, a, http.StatusCreated, "")
	}
	seed(alphaAdmin, "order-a")
	seed(alphaAdmin, "order-a2")
	seed(betaUse, "order-b")
	seed(betaUse, "order-b2")

	rec := func(tenant, key string) string { return query("/console/api/records", "tenant", tenant, "key", key) }
	tests := []struct {
		name   string
		token  string
		method string
		path   string
		status int
		code   string
	}{
		{"a user reads its own tenant's key", alphaUse, http.MethodGet, rec("", "order-a"), 200, ""},
		{"a user names its own tenant", alphaUse, http.MethodGet, rec("alpha", "order-a"), 200, ""},
		{"a user cannot read another tenant's key", alphaUse, http.MethodGet, rec("beta", "order-b"), 403, "forbidden"},
		{"a tenant's admin cannot either", alphaAdmin, http.MethodGet, rec("beta", "order-b"), 403, "forbidden"},
		{"nor learn whether a tenant exists", alphaAdmin, http.MethodGet, rec("nosuch", "order-b"), 403, "forbidden"},
		{"a user cannot list another tenant's feed", alphaUse, http.MethodGet, query("/console/api/abandoned", "tenant", "beta"), 403, "forbidden"},
		{"a user cannot read another tenant's traffic", alphaUse, http.MethodGet, query("/console/api/traffic", "tenant", "beta"), 403, "forbidden"},
		{"a user reads its own feed", alphaUse, http.MethodGet, "/console/api/abandoned", 200, ""},
		{"a user reads its own traffic", alphaUse, http.MethodGet, "/console/api/traffic", 200, ""},
		{"a user cannot purge through the console", alphaUse, http.MethodDelete, rec("", "order-a"), 403, "forbidden"},
		{"a user cannot purge through the API", alphaUse, http.MethodDelete, recordPath("order-a"), 403, "forbidden"},
		{"a tenant's admin cannot purge in another tenant", alphaAdmin, http.MethodDelete, rec("beta", "order-b"), 403, "forbidden"},
		{"a platform reader reads another tenant", platformReader, http.MethodGet, rec("beta", "order-b"), 200, ""},
		{"a platform reader cannot purge", platformReader, http.MethodDelete, rec("beta", "order-b"), 403, "forbidden"},
		{"a platform admin reads another tenant's feed", platformAdmin, http.MethodGet, query("/console/api/abandoned", "tenant", "beta"), 200, ""},
		{"a platform admin reads another tenant's traffic", platformAdmin, http.MethodGet, query("/console/api/traffic", "tenant", "alpha"), 200, ""},
		{"a platform admin names a tenant the file lacks", platformAdmin, http.MethodGet, rec("nosuch", "order-b"), 404, "not_found"},
		{"the API stays in the token's tenant", platformAdmin, http.MethodGet, recordPath("order-b"), 404, "not_found"},
		{"a platform admin purges in another tenant", platformAdmin, http.MethodDelete, rec("beta", "order-b"), 204, ""},
		{"a tenant's admin purges at home through the console", alphaAdmin, http.MethodDelete, rec("", "order-a2"), 204, ""},
		{"a tenant's admin purges at home through the API", alphaAdmin, http.MethodDelete, recordPath("order-a"), 204, ""},
		{"a tenant's token cannot read the store view", alphaUse, http.MethodGet, "/console/api/store", 403, "forbidden"},
		{"nor can a tenant's admin", alphaAdmin, http.MethodGet, "/console/api/store", 403, "forbidden"},
		{"a platform token reads the store view", platformReader, http.MethodGet, "/console/api/store", 200, ""},
		{"no token", "", http.MethodGet, rec("", "order-a"), 401, "unauthenticated"},
		{"an unknown token", "nobody", http.MethodGet, "/console/api/whoami", 401, "unauthenticated"},
	}
	for _, tt := range tests {
		a := d.call(tt.token, tt.method, tt.path, nil)
		expectStatus(t, tt.name, a, tt.status, tt.code)
		if tt.code == "forbidden" && !strings.Contains(a.str("detail"), "scope") {
			t.Errorf("%s: detail %q names no scope", tt.name, a.str("detail"))
		}
	}
	if a := d.call(alphaUse, http.MethodGet, rec("", "order-a"), nil); a.status != http.StatusNotFound {
		t.Errorf("order-a after its purge: %d %s", a.status, a.raw)
	}
	if a := d.call(betaUse, http.MethodGet, recordPath("order-b2"), nil); a.status != http.StatusOK {
		t.Errorf("beta's order-b2 after the refused calls: %d %s", a.status, a.raw)
	}

	who := d.call(platformReader, http.MethodGet, "/console/api/whoami", nil)
	if who.str("tenant") != "ops" || who.str("token") != "platform-viewer" || who.raw == "" || !strings.Contains(who.raw, `"scopes":["platform","use"]`) || !strings.Contains(who.raw, `"open":false`) {
		t.Errorf("whoami: %s", who.raw)
	}
	tenants := func(token string) string {
		return strings.TrimSpace(d.call(token, http.MethodGet, "/console/api/tenants", nil).raw)
	}
	if got := tenants(alphaAdmin); got != `{"own":"alpha","tenants":["alpha"]}` {
		t.Errorf("a tenant's admin sees the tenants %s; want its own only", got)
	}
	if got := tenants(platformReader); got != `{"own":"ops","tenants":["alpha","beta","ops"]}` {
		t.Errorf("a platform token sees the tenants %s; want every one", got)
	}

	logs := d.logs.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`"msg":"record purged","tenant":"beta","key":"order-b","token":"platform-oncall","token_tenant":"ops","via":"console"`),
		regexp.MustCompile(`"msg":"record purged","tenant":"alpha","key":"order-a2","token":"alpha-ops","token_tenant":"alpha","via":"console"`),
		regexp.MustCompile(`"msg":"record purged","tenant":"alpha","key":"order-a","token":"alpha-ops","token_tenant":"alpha","via":"api"`),
		regexp.MustCompile(`"msg":"console request refused: missing scope".*"token":"alpha-app","asked_tenant":"beta"`),
	} {
		if !want.MatchString(logs) {
			t.Errorf("the log has no line matching %s:\n%s", want, logs)
		}
	}
	if n := strings.Count(logs, `"msg":"record purged"`); n != 3 {
		t.Errorf("%d purges logged, want 3", n)
	}
}

// TestConsoleOpen: without an auth file the console works in the default tenant with
// no token, and no other tenant can be named.
func TestConsoleOpen(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), true, server.StoreInfo{Kind: "embedded"})
	who := d.call("", http.MethodGet, "/console/api/whoami", nil)
	if who.status != 200 || who.str("tenant") != "default" || !strings.Contains(who.raw, `"open":true`) {
		t.Fatalf("whoami: %d %s", who.status, who.raw)
	}
	expectStatus(t, "claim", d.call("", http.MethodPost, "/v1/claim", map[string]any{"key": "k"}), 201, "")
	expectStatus(t, "lookup", d.call("", http.MethodGet, query("/console/api/records", "key", "k"), nil), 200, "")
	expectStatus(t, "another tenant", d.call("", http.MethodGet, query("/console/api/records", "tenant", "other", "key", "k"), nil), 403, "forbidden")
	expectStatus(t, "purge", d.call("", http.MethodDelete, query("/console/api/records", "tenant", "default", "key", "k"), nil), 204, "")
	// Open, whoever reaches the daemon runs it: the store view is theirs.
	expectStatus(t, "the store view", d.call("", http.MethodGet, "/console/api/store", nil), 200, "")
}

// TestConsoleRefusesBadInput: every bad input gets a problem naming the field.
func TestConsoleRefusesBadInput(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	long := strings.Repeat("k", 256)
	tests := []struct {
		name, path, field string
	}{
		{"derive without a scope", query("/console/api/derive", "idempotency_key", "k"), "scope"},
		{"derive with a scope not UTF-8", "/console/api/derive?scope=%FF&idempotency_key=k", "scope"},
		{"derive without a key", query("/console/api/derive", "scope", "s"), "idempotency_key"},
		{"derive with a key too long", query("/console/api/derive", "scope", "s", "idempotency_key", long), "idempotency_key"},
		{"derive with a prefix too long", query("/console/api/derive", "scope", "s", "idempotency_key", "k", "prefix", strings.Repeat("p", 173)), "prefix"},
		{"derive with a prefix not UTF-8", "/console/api/derive?scope=s&idempotency_key=k&prefix=%C3", "prefix"},
		{"lookup without a key", "/console/api/records", "key"},
		{"lookup with a key too long", query("/console/api/records", "key", long), "key"},
		{"lookup with a key not UTF-8", "/console/api/records?key=%FF", "key"},
		{"lookup in a malformed tenant", query("/console/api/records", "tenant", "Alpha!", "key", "k"), "tenant"},
		{"lookup with a tenant given twice", "/console/api/records?tenant=alpha&tenant=beta&key=k", "tenant"},
		{"lookup with an unknown parameter", query("/console/api/records", "key", "k", "keys", "k"), "keys"},
		{"feed with a limit not a number", query("/console/api/abandoned", "limit", "ten"), "limit"},
		{"feed with a limit of 0", query("/console/api/abandoned", "limit", "0"), "limit"},
		{"feed with a limit too large", query("/console/api/abandoned", "limit", "100000000000"), "limit"},
		{"feed with a negative age", query("/console/api/abandoned", "older_than_ms", "-1"), "older_than_ms"},
		{"feed with a bad cursor", query("/console/api/abandoned", "cursor", "!!!"), "cursor"},
		{"feed with a prefix not UTF-8", "/console/api/abandoned?prefix=%FF", "prefix"},
		{"traffic with an unknown parameter", query("/console/api/traffic", "window", "5m"), "window"},
		{"whoami with a parameter", query("/console/api/whoami", "tenant", "beta"), "tenant"},
		{"store with a parameter", query("/console/api/store", "verbose", "1"), "verbose"},
	}
	for _, tt := range tests {
		a := d.call(platformAdmin, http.MethodGet, tt.path, nil)
		expectStatus(t, tt.name, a, http.StatusBadRequest, "invalid_request")
		if !strings.HasPrefix(a.str("detail"), tt.field+" ") && !strings.HasPrefix(a.str("detail"), tt.field+":") {
			t.Errorf("%s: detail %q does not start with the field %s", tt.name, a.str("detail"), tt.field)
		}
		wantConsoleHeaders(t, tt.name, a)
	}
	a := d.call(platformAdmin, http.MethodDelete, query("/console/api/records", "tenant", "beta"), nil)
	expectStatus(t, "purge without a key", a, http.StatusBadRequest, "invalid_request")
}

// TestConsoleDerivesTheMiddlewaresKey: the console derives a middleware's key as every
// SDK does, by the shared vectors, with the middlewares' optional prefix before it.
func TestConsoleDerivesTheMiddlewaresKey(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "clients", "testdata", "idemd_key.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct {
			Name     string `json:"name"`
			Scope    string `json:"scope"`
			Key      string `json:"key"`
			IdemdKey string `json:"idemd_key"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	for _, v := range file.Vectors {
		for _, prefix := range []string{"", "checkout:"} {
			a := d.call(alphaUse, http.MethodGet, query("/console/api/derive", "scope", v.Scope, "idempotency_key", v.Key, "prefix", prefix), nil)
			if a.status != 200 || a.str("key") != prefix+v.IdemdKey {
				t.Errorf("%s, prefix %q: %d %s, want %s", v.Name, prefix, a.status, a.raw, prefix+v.IdemdKey)
			}
		}
	}
}

// TestConsoleRecordSaysMoreThanTheAPI: the console's lookup is the API's record, plus the
// tenant, whether the lease was taken over, and the daemon's clock.
func TestConsoleRecordSaysMoreThanTheAPI(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	a := d.call(alphaAdmin, http.MethodPost, "/v1/claim", map[string]any{"key": "taken-over", "lease_ms": 100})
	expectStatus(t, "first claim", a, 201, "")
	wait.For(t, 10*time.Second, "the first lease to run out and the key to be taken over", func() bool {
		return d.call(alphaAdmin, http.MethodPost, "/v1/claim", map[string]any{"key": "taken-over", "lease_ms": 60000}).status == 201
	})
	api := d.call(alphaUse, http.MethodGet, recordPath("taken-over"), nil)
	con := d.call(alphaUse, http.MethodGet, query("/console/api/records", "key", "taken-over"), nil)
	expectStatus(t, "console lookup", con, 200, "")
	for field, value := range api.body {
		got, _ := json.Marshal(con.body[field])
		want, _ := json.Marshal(value)
		if string(got) != string(want) {
			t.Errorf("%s: the console says %s, the API %s", field, got, want)
		}
	}
	if con.body["recovered"] != true || con.str("tenant") != "alpha" || con.body["attempt"] != float64(2) {
		t.Errorf("console record: %s", con.raw)
	}
	if st, err := time.Parse(time.RFC3339Nano, con.str("server_time")); err != nil || time.Since(st) < 0 {
		t.Errorf("server_time %q: %v", con.str("server_time"), err)
	}
}

// TestConsoleRecordSaysWhetherItsPointIsSealed: a recovery point is sealed when its
// data is an envelope by the check the daemon makes of a sealed result (marker,
// version, key id, length), not when its first byte merely is the marker.
func TestConsoleRecordSaysWhetherItsPointIsSealed(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	for _, c := range []struct {
		name   string
		data   []byte
		sealed bool
	}{
		{"an envelope", envelope(1, "k-2026-05", 50), true},
		{"the marker then text", []byte("\xC1 is where this point's data starts"), false},
		{"the marker alone", []byte{0xC1}, false},
		{"an envelope's head, too short", envelope(1, "k1", 10), false},
		{"an unknown version", envelope(9, "k1", 50), false},
		{"plain data", []byte(`{"charge":"ch_1"}`), false},
	} {
		key := "point-" + c.name
		a := d.call(alphaAdmin, http.MethodPost, "/v1/claim", map[string]any{"key": key, "lease_ms": 60000})
		expectStatus(t, "claim "+key, a, 201, "")
		expectStatus(t, "point "+key, d.call(alphaAdmin, http.MethodPost, "/v1/recovery-point",
			map[string]any{"key": key, "lease_token": a.str("lease_token"), "name": "step", "data": c.data}), 200, "")
		con := d.call(alphaUse, http.MethodGet, query("/console/api/records", "key", key), nil)
		expectStatus(t, "console lookup "+key, con, 200, "")
		if got, _ := con.body["recovery_point_sealed"].(bool); got != c.sealed {
			t.Errorf("%s: recovery_point_sealed is %v, want %v: %s", c.name, con.body["recovery_point_sealed"], c.sealed, con.raw)
		}
	}
}

// TestConsoleTrafficCountsClaims sends claims of each outcome, alone and in a batch, and
// reads them back from the traffic endpoint, counted under their tenant only.
func TestConsoleTrafficCountsClaims(t *testing.T) {
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded"})
	claim := func(key, fingerprint string) authAnswer {
		return d.call(alphaAdmin, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": fingerprint})
	}
	for _, key := range []string{"t1", "t2", "t3"} {
		expectStatus(t, key, claim(key, "f"), 201, "")
	}
	token := claim("done", "f").str("lease_token")
	expectStatus(t, "complete", d.call(alphaAdmin, http.MethodPost, "/v1/complete",
		map[string]any{"key": "done", "lease_token": token, "response": map[string]any{"status": 200}}), 200, "")
	expectStatus(t, "replay", claim("done", "f"), 200, "")
	expectStatus(t, "replay", claim("done", "f"), 200, "")
	expectStatus(t, "in progress", claim("t1", "f"), 409, "in_progress")
	expectStatus(t, "mismatch", claim("t1", "g"), 422, "fingerprint_mismatch")
	expectStatus(t, "invalid", claim("", "f"), 400, "invalid_request")
	batch := d.call(alphaAdmin, http.MethodPost, "/v1/batch", map[string]any{"items": []any{
		map[string]any{"claim": map[string]any{"key": "b1"}},
		map[string]any{"claim": map[string]any{"key": "done", "fingerprint": "f"}},
	}})
	expectStatus(t, "batch", batch, 200, "")
	expectStatus(t, "beta's claim", d.call(betaUse, http.MethodPost, "/v1/claim", map[string]any{"key": "t1"}), 201, "")

	want := map[string]float64{"acquired": 5, "replayed": 3, "in_progress": 1, "fingerprint_mismatch": 1, "other": 1}
	var got authAnswer
	// The counts cover whole seconds that have passed, so the last claim shows once
	// its second is over.
	wait.For(t, 10*time.Second, "the claims to be counted", func() bool {
		got = d.call(alphaUse, http.MethodGet, "/console/api/traffic", nil)
		totals, _ := got.body["totals"].(map[string]any)
		for outcome, n := range want {
			if totals[outcome] != n {
				return false
			}
		}
		return true
	})
	if got.str("tenant") != "alpha" || got.body["tracked"] != true {
		t.Errorf("traffic: %s", got.raw)
	}
	p50, _ := got.body["p50_ms"].([]any)
	if len(p50) != 180 || !slices.ContainsFunc(p50, func(v any) bool { f, ok := v.(float64); return ok && f > 0 }) {
		t.Errorf("p50_ms: %v, want 180 seconds with a latency in some", p50)
	}
	beta := d.call(platformAdmin, http.MethodGet, query("/console/api/traffic", "tenant", "beta"), nil)
	if totals := beta.body["totals"].(map[string]any); totals["acquired"] != float64(1) || totals["replayed"] != float64(0) {
		t.Errorf("beta's traffic: %v", totals)
	}
}

// TestConsoleStoreView: the kind and layout the daemon gave, readiness, and for Redis
// each master with its round trip, read from the store's own metrics.
func TestConsoleStoreView(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded", Layout: "bbolt", Location: "/data/idemd.db"})
		a := d.call(platformReader, http.MethodGet, "/console/api/store", nil)
		if got := strings.TrimSpace(a.raw); got != `{"kind":"embedded","layout":"bbolt","location":"/data/idemd.db","ready":true,"masters":[]}` {
			t.Errorf("store: %s", got)
		}
	})
	t.Run("redis", func(t *testing.T) {
		r := testredis.Start(t)
		store := redisStoreFor(t, r)
		d := newConsoleDaemon(t, store, false, server.StoreInfo{Kind: "redis", Layout: "strings", Location: r.URL(), Stats: store})
		expectStatus(t, "claim", d.call(alphaUse, http.MethodPost, "/v1/claim", map[string]any{"key": "k"}), 201, "")
		a := d.call(platformAdmin, http.MethodGet, "/console/api/store", nil)
		masters, _ := a.body["masters"].([]any)
		if a.str("kind") != "redis" || a.body["ready"] != true || len(masters) != 1 {
			t.Fatalf("store: %s", a.raw)
		}
		m := masters[0].(map[string]any)
		if rt, _ := m["round_trip_ms"].(float64); rt <= 0 || m["address"] != r.Addr() || m["pipelines"] == nil {
			t.Errorf("master: %v, want %s with a round trip", m, r.Addr())
		}
	})
}
