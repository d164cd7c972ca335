package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"gopkg.in/yaml.v3"
)

// NewToken returns a fresh API token: 256 random bits as 64 hex digits. That strength
// is what lets the auth file keep an unsalted SHA-256 of it.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b)
}

// HashToken is the value of the auth file's sha256 field for token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// TokenEntry renders the auth file's entry for a token that hashes to hash, as one item
// of the tokens list. The entry is checked as the daemon checks a file that declares
// the tenant, so a bad tenant name or scope is refused here rather than at the reload.
func TokenEntry(name, tenant string, scopes []Scope, hash string) (string, error) {
	var doc yaml.Node
	if err := doc.Encode([]token{{Name: name, Tenant: tenant, Scopes: scopes, SHA256: hash}}); err != nil {
		return "", err
	}
	// Scopes read best on one line, as docs/auth.md writes them.
	for _, item := range doc.Content {
		for i := 0; i+1 < len(item.Content); i += 2 {
			if item.Content[i].Value == "scopes" {
				item.Content[i+1].Style = yaml.FlowStyle
			}
		}
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return "", err
	}
	entry := string(out)
	if _, err := Parse([]byte(fmt.Sprintf("tenants: {%q: {}}\ntokens:\n%s", tenant, indent(entry)))); err != nil {
		return "", err
	}
	return entry, nil
}

// indent shifts YAML two spaces to the right, to sit under a key.
func indent(s string) string {
	var out []byte
	atLineStart := true
	for i := 0; i < len(s); i++ {
		if atLineStart && s[i] != '\n' {
			out = append(out, ' ', ' ')
		}
		out = append(out, s[i])
		atLineStart = s[i] == '\n'
	}
	return string(out)
}
