package auth

import (
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the auth file parser: it must never panic, and
// whatever it accepts must be a usable configuration: valid tenant names, and tokens
// that resolve only to declared tenants.
func FuzzParse(f *testing.F) {
	f.Add([]byte(sampleFile()))
	f.Add([]byte(`{"tenants":{"a":{}},"tokens":[{"tenant":"a","scopes":["use"],"sha256":"` + strings.Repeat("ab", 32) + `"}]}`))
	f.Add([]byte("tenants:\n  a: {max_retention: 72h, rate: 5, burst: 1}\ntokens: []\n"))
	f.Add([]byte("tenants: [1, 2]"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := Parse(raw)
		if err != nil {
			if cfg != nil {
				t.Fatalf("Parse returned a config with an error: %v", err)
			}
			return
		}
		for _, name := range cfg.Tenants() {
			if !ValidTenant(name) {
				t.Fatalf("accepted tenant name %q", name)
			}
		}
		if _, err := cfg.Authenticate("not-a-token-in-the-file"); err == nil {
			t.Fatal("an unknown token authenticated")
		}
	})
}
