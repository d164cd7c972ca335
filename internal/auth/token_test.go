package auth

import (
	"strings"
	"testing"
)

// TestTokenEntry makes a token, renders its entry, and checks that a file holding the
// entry authenticates the token, and only through its hash.
func TestTokenEntry(t *testing.T) {
	tok := NewToken()
	if len(tok) != 64 || tok == NewToken() {
		t.Fatalf("NewToken = %q", tok)
	}
	entry, err := TokenEntry("payments-oncall", "payments", []Scope{ScopeUse, ScopeAdmin}, HashToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	want := "- name: payments-oncall\n  tenant: payments\n  scopes: [use, admin]\n  sha256: " + hashOf(tok) + "\n"
	if entry != want {
		t.Fatalf("entry:\n%s\nwant:\n%s", entry, want)
	}
	if strings.Contains(entry, tok) {
		t.Fatal("the entry holds the token itself")
	}
	cfg, err := Parse([]byte("tenants:\n  payments: {}\ntokens:\n" + entry))
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Authenticate(tok)
	if err != nil || p.Tenant.Name != "payments" || p.Name != "payments-oncall" || !p.Can(ScopeAdmin) || !p.Can(ScopeUse) {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}

	unnamed, err := TokenEntry("", "search", []Scope{ScopeUse}, HashToken(tok))
	if err != nil || strings.Contains(unnamed, "name") {
		t.Fatalf("an entry without a name: %q %v", unnamed, err)
	}
}

func TestTokenEntryRefuses(t *testing.T) {
	hash := HashToken(NewToken())
	for _, tc := range []struct {
		name   string
		tenant string
		scopes []Scope
		hash   string
		want   string
	}{
		{"bad tenant name", "Payments", []Scope{ScopeUse}, hash, "not a valid tenant name"},
		{"no tenant", "", []Scope{ScopeUse}, hash, "tenant"},
		{"unknown scope", "payments", []Scope{"write"}, hash, `unknown scope "write"`},
		{"no scope", "payments", nil, hash, "scopes is required"},
		{"not a hash", "payments", []Scope{ScopeUse}, "secret", "sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := TokenEntry("n", tc.tenant, tc.scopes, tc.hash); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("TokenEntry = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
