package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func hashOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// sampleFile is an auth file with two tenants and three tokens.
func sampleFile() string {
	return `
tenants:
  payments:
    max_response_bytes: 4096
    max_retention: 72h
    rate: 10
    burst: 20
    max_stored_bytes: 1073741824
    max_records: 100000
  search: {}
tokens:
  - name: payments-api
    tenant: payments
    scopes: [use]
    sha256: ` + hashOf("pay-use") + `
  - name: payments-oncall
    tenant: payments
    scopes: [use, admin]
    sha256: ` + strings.ToUpper(hashOf("pay-admin")) + `
  - tenant: search
    scopes: [admin]
    sha256: ` + hashOf("search-admin") + `
`
}

func TestParseAndAuthenticate(t *testing.T) {
	cfg, err := Parse([]byte(sampleFile()))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		token     string
		err       error
		tenant    string
		use       bool
		admin     bool
		tokenName string
	}{
		{name: "use token", token: "pay-use", tenant: "payments", use: true, tokenName: "payments-api"},
		{name: "upper-case hash in the file still matches", token: "pay-admin", tenant: "payments", use: true, admin: true, tokenName: "payments-oncall"},
		{name: "admin alone does not imply use", token: "search-admin", tenant: "search", admin: true},
		{name: "no token", token: "", err: ErrMissingToken},
		{name: "unknown token", token: "pay-use2", err: ErrUnknownToken},
		{name: "the hash itself is not a token", token: hashOf("pay-use"), err: ErrUnknownToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := cfg.Authenticate(tt.token)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Tenant.Name != tt.tenant || p.Can(ScopeUse) != tt.use || p.Can(ScopeAdmin) != tt.admin || p.Name != tt.tokenName {
				t.Fatalf("got tenant %q use %v admin %v name %q", p.Tenant.Name, p.Can(ScopeUse), p.Can(ScopeAdmin), p.Name)
			}
			err = p.Authorize(ScopeAdmin)
			if tt.admin != (err == nil) || (err != nil && !errors.Is(err, ErrForbidden)) {
				t.Fatalf("Authorize(admin) = %v", err)
			}
		})
	}
	p, _ := cfg.Authenticate("pay-use")
	want := Limits{MaxResponseBytes: 4096, MaxRetention: 72 * time.Hour, Rate: 10, Burst: 20,
		MaxStoredBytes: 1 << 30, MaxRecords: 100000}
	if p.Tenant.Limits != want {
		t.Fatalf("limits = %+v, want %+v", p.Tenant.Limits, want)
	}
}

// TestPlatformScope: platform lets a token act in other tenants, with the scopes it
// holds besides, and changes nothing in its own.
func TestPlatformScope(t *testing.T) {
	file := `
tenants: {ops: {}, payments: {}}
tokens:
  - {name: platform-admin, tenant: ops, scopes: [use, admin, platform], sha256: ` + hashOf("plat-admin") + `}
  - {name: platform-reader, tenant: ops, scopes: [platform, use], sha256: ` + hashOf("plat-use") + `}
  - {name: ops-admin, tenant: ops, scopes: [use, admin], sha256: ` + hashOf("ops-admin") + `}
`
	cfg, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		token  string
		tenant string
		scope  Scope
		need   Scope // the scope the refusal names; "" when allowed
	}{
		{"platform admin purges in another tenant", "plat-admin", "payments", ScopeAdmin, ""},
		{"platform admin reads another tenant", "plat-admin", "payments", ScopeUse, ""},
		{"platform admin in its own tenant", "plat-admin", "ops", ScopeAdmin, ""},
		{"platform reader reads another tenant", "plat-use", "payments", ScopeUse, ""},
		{"platform does not make a reader an admin", "plat-use", "payments", ScopeAdmin, ScopeAdmin},
		{"platform does not make a reader an admin at home", "plat-use", "ops", ScopeAdmin, ScopeAdmin},
		{"a tenant's admin stays in its tenant", "ops-admin", "payments", ScopeUse, ScopePlatform},
		{"a tenant's admin purges at home", "ops-admin", "ops", ScopeAdmin, ""},
		{"asking only about the tenant", "ops-admin", "payments", "", ScopePlatform},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := cfg.Authenticate(tt.token)
			if err != nil {
				t.Fatal(err)
			}
			err = p.AuthorizeIn(tt.tenant, tt.scope)
			var forbidden *ForbiddenError
			switch {
			case tt.need == "" && err != nil:
				t.Fatalf("AuthorizeIn(%s, %s) = %v, want allowed", tt.tenant, tt.scope, err)
			case tt.need != "" && (!errors.As(err, &forbidden) || forbidden.Need != tt.need || !errors.Is(err, ErrForbidden)):
				t.Fatalf("AuthorizeIn(%s, %s) = %v, want a refusal for lack of %s", tt.tenant, tt.scope, err, tt.need)
			}
		})
	}
	p, _ := cfg.Authenticate("plat-use")
	if got := p.Scopes(); len(got) != 2 || got[0] != ScopePlatform || got[1] != ScopeUse {
		t.Fatalf("Scopes() = %v, want the file's [platform use]", got)
	}
	if p := Open("default"); p.Can(ScopePlatform) {
		t.Fatal("the open principal holds platform; without an auth file there is one tenant and nothing to widen to")
	}
}

func TestParseJSON(t *testing.T) {
	raw := "{\n\t\"tenants\": {\"payments\": {\"max_retention\": 3600000, \"rate\": 2}},\n" +
		"\t\"tokens\": [{\"tenant\": \"payments\", \"scopes\": [\"use\"], \"sha256\": \"" + hashOf("x") + "\"}]\n}\n"
	cfg, err := Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Authenticate("x")
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{MaxRetention: time.Hour, Rate: 2, Burst: 2}
	if p.Tenant.Limits != want {
		t.Fatalf("limits = %+v, want %+v (milliseconds, burst defaulting to a second's worth)", p.Tenant.Limits, want)
	}
}

func TestParseRejects(t *testing.T) {
	h := hashOf("t")
	tok := func(tenant, scopes, hash string) string {
		return "tokens:\n  - {tenant: " + tenant + ", scopes: " + scopes + ", sha256: '" + hash + "'}\n"
	}
	tests := []struct {
		name string
		file string
		want string
	}{
		{"empty file", "", "empty"},
		{"no tokens", "tenants: {a: {}}\n", "no tokens"},
		{"unknown field, e.g. a clear-text token", "tenants: {a: {}}\n" + "tokens:\n  - {tenant: a, scopes: [use], token: secret}\n", "token"},
		{"tenant name with a colon", "tenants: {'a:b': {}}\n" + tok("'a:b'", "[use]", h), "not a valid tenant name"},
		{"upper-case tenant name", "tenants: {Payments: {}}\n" + tok("Payments", "[use]", h), "not a valid tenant name"},
		{"tenant name starting with a dash", "tenants: {'-x': {}}\n" + tok("'-x'", "[use]", h), "not a valid tenant name"},
		{"tenant name of 65 characters", "tenants: {" + strings.Repeat("a", 65) + ": {}}\n" + tok(strings.Repeat("a", 65), "[use]", h), "not a valid tenant name"},
		{"undeclared tenant", "tenants: {a: {}}\n" + tok("b", "[use]", h), "not declared"},
		{"missing tenant", "tenants: {a: {}}\n" + tok("''", "[use]", h), "tenant is required"},
		{"short hash", "tenants: {a: {}}\n" + tok("a", "[use]", h[:60]), "60 characters"},
		{"hash not hex", "tenants: {a: {}}\n" + tok("a", "[use]", "zz"+h[2:]), "not hexadecimal"},
		{"missing hash", "tenants: {a: {}}\n" + tok("a", "[use]", ""), "required"},
		{"duplicate hash", "tenants: {a: {}}\n" + tok("a", "[use]", h) + "  - {tenant: a, scopes: [admin], sha256: '" + h + "'}\n", "same sha256"},
		{"no scopes", "tenants: {a: {}}\n" + tok("a", "[]", h), "scopes is required"},
		{"unknown scope", "tenants: {a: {}}\n" + tok("a", "[read]", h), "unknown scope"},
		{"a scope in capitals", "tenants: {a: {}}\n" + tok("a", "[Platform, use]", h), "unknown scope"},
		{"platform alone", "tenants: {a: {}}\n" + tok("a", "[platform]", h), "list it with use, admin or both"},
		{"bad retention", "tenants: {a: {max_retention: soon}}\n" + tok("a", "[use]", h), "neither a duration"},
		{"negative retention", "tenants: {a: {max_retention: -1h}}\n" + tok("a", "[use]", h), "negative"},
		{"negative response bytes", "tenants: {a: {max_response_bytes: -1}}\n" + tok("a", "[use]", h), "negative"},
		{"negative stored bytes", "tenants: {a: {max_stored_bytes: -1}}\n" + tok("a", "[use]", h), "max_stored_bytes must not be negative"},
		{"negative records", "tenants: {a: {max_records: -1}}\n" + tok("a", "[use]", h), "max_records must not be negative"},
		{"negative rate", "tenants: {a: {rate: -1}}\n" + tok("a", "[use]", h), "rate"},
		{"burst without rate", "tenants: {a: {burst: 5}}\n" + tok("a", "[use]", h), "without a rate"},
		{"a second document of garbage", "tenants: {a: {}}\n" + tok("a", "[use]", h) + "---\n:: [not yaml\n", "one document"},
		{"a second, valid document", "tenants: {a: {}}\n" + tok("a", "[use]", h) + "---\ntenants: {b: {}}\n", "one document"},
		{"an empty second document", "tenants: {a: {}}\n" + tok("a", "[use]", h) + "---\n", "one document"},
		{"JSON with trailing garbage", `{"tenants": {"a": {}}, "tokens": [{"tenant": "a", "scopes": ["use"], "sha256": "` + h + `"}]} x`, "one document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.file))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestBucket(t *testing.T) {
	start := time.Unix(1000, 0)
	b := newBucket(2, 3, start)
	for i := range 3 {
		if wait := b.take(start); wait != 0 {
			t.Fatalf("request %d of the burst waited %s", i+1, wait)
		}
	}
	if wait := b.take(start); wait != 500*time.Millisecond {
		t.Fatalf("after the burst: wait %s, want 500ms at 2/s", wait)
	}
	if wait := b.take(start.Add(250 * time.Millisecond)); wait != 250*time.Millisecond {
		t.Fatalf("a quarter second later: wait %s, want 250ms", wait)
	}
	if wait := b.take(start.Add(500 * time.Millisecond)); wait != 0 {
		t.Fatalf("half a second later: wait %s, want a token", wait)
	}
	if wait := b.take(start.Add(-time.Hour)); wait == 0 {
		t.Fatal("a clock stepping back must not add tokens")
	}
	if wait := b.take(start.Add(time.Hour)); wait != 0 {
		t.Fatalf("an hour later: wait %s", wait)
	}
	for range 2 {
		b.take(start.Add(time.Hour))
	}
	if wait := b.take(start.Add(time.Hour)); wait == 0 {
		t.Fatal("an idle hour must refill to the burst, not beyond it")
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestKeyringReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, path, sampleFile())
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := k.Authenticate("pay-use")
	if err != nil {
		t.Fatal(err)
	}
	// Spend the payments tenant's burst.
	for i := range 20 {
		if err := p.Tenant.Allow(); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}

	writeFile(t, path, "tenants: [not, a, map]\n")
	if err := k.Reload(); err == nil {
		t.Fatal("a bad file reloaded without an error")
	}
	if _, err := k.Authenticate("pay-use"); err != nil {
		t.Fatalf("after a failed reload the old tokens must still work: %v", err)
	}

	// Rotate: pay-use is gone, pay-new arrives; payments keeps its rate, search gets one.
	rotated := strings.Replace(sampleFile(), hashOf("pay-use"), hashOf("pay-new"), 1)
	rotated = strings.Replace(rotated, "search: {}", "search: {rate: 1}", 1)
	writeFile(t, path, rotated)
	if err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate("pay-use"); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("a removed token: err = %v, want ErrUnknownToken", err)
	}
	p, err = k.Authenticate("pay-new")
	if err != nil {
		t.Fatal(err)
	}
	var limited *RateLimitedError
	if err := p.Tenant.Allow(); !errors.As(err, &limited) || limited.Tenant != "payments" {
		t.Fatalf("a reload must not refill an unchanged tenant's bucket: Allow = %v", err)
	}
	s, _ := k.Authenticate("search-admin")
	if err := s.Tenant.Allow(); err != nil {
		t.Fatalf("a tenant given a rate starts with a full bucket: %v", err)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := k.Reload(); err == nil {
		t.Fatal("reloading a missing file must fail")
	}
	if _, err := k.Authenticate("pay-new"); err != nil {
		t.Fatalf("after a failed reload the tokens in force must still work: %v", err)
	}
}

// TestKeyringReloadUnderLoad authenticates from many goroutines while the file is
// reloaded: a token present in every version never fails.
func TestKeyringReloadUnderLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, path, sampleFile())
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := k.Authenticate("pay-admin"); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range 50 {
		content := sampleFile()
		if i%2 == 1 {
			content = strings.Replace(content, hashOf("pay-use"), hashOf("other"), 1)
		}
		writeFile(t, path, content)
		if err := k.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("authentication failed during reloads: %v", err)
	}
}

// TestDocumentedExample parses the example auth file of docs/auth.md.
func TestDocumentedExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/auth.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	example, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/auth.md has no yaml example")
	}
	cfg, err := Parse([]byte(example))
	if err != nil {
		t.Fatalf("the documented example does not parse: %v", err)
	}
	if cfg.Tokens() != 3 || len(cfg.Tenants()) != 2 {
		t.Fatalf("the documented example has %d tokens and %d tenants", cfg.Tokens(), len(cfg.Tenants()))
	}
}
