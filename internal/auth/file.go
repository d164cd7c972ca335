package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// tenantName is what a tenant may be called. Tenant names become part of store keys
// (Redis keys are idem:<tenant>:<hash>), so they hold no separator, and they start with
// a letter or digit so that none can be mistaken for the "-" that metrics use for
// unauthenticated requests.
var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// ValidTenant reports whether name may name a tenant.
func ValidTenant(name string) bool { return tenantName.MatchString(name) }

// file is the auth file as written. JSON is accepted too: the YAML decoder reads it.
type file struct {
	Tenants map[string]tenantLimits `yaml:"tenants"`
	Tokens  []token                 `yaml:"tokens"`
}

type tenantLimits struct {
	MaxResponseBytes int      `yaml:"max_response_bytes"`
	MaxRetention     duration `yaml:"max_retention"`
	Rate             float64  `yaml:"rate"`
	Burst            int      `yaml:"burst"`
	MaxStoredBytes   int64    `yaml:"max_stored_bytes"`
	MaxRecords       int64    `yaml:"max_records"`
}

type token struct {
	Name   string  `yaml:"name,omitempty"`
	Tenant string  `yaml:"tenant"`
	Scopes []Scope `yaml:"scopes"`
	SHA256 string  `yaml:"sha256"`
}

// duration is a Go duration string ("72h", "90m") or a whole number of milliseconds.
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as \"72h\" or milliseconds", n.Line)
	}
	if ms, err := strconv.ParseInt(n.Value, 10, 64); err == nil {
		if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
			return fmt.Errorf("line %d: %d ms is out of range", n.Line, ms)
		}
		*d = duration(time.Duration(ms) * time.Millisecond)
		return nil
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is neither a duration such as \"72h\" nor milliseconds", n.Line, n.Value)
	}
	*d = duration(v)
	return nil
}

// Parse reads an auth file (YAML or JSON) and checks it whole: unknown fields, bad
// tenant names, malformed hashes, a hash listed twice, unknown scopes and tokens of
// undeclared tenants are all errors, so that a typo fails loudly instead of locking a
// team out or opening a key space nobody meant to.
func Parse(raw []byte) (*Config, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the auth file is empty")
		}
		return nil, err
	}
	// The decoder reads one document at a time; whatever follows the first would be
	// ignored, so a file whose second half is broken or meant to count would load.
	var rest yaml.Node
	if err := dec.Decode(&rest); !errors.Is(err, io.EOF) {
		if err == nil {
			return nil, fmt.Errorf("line %d: a second YAML document; the auth file is one document", rest.Line)
		}
		return nil, fmt.Errorf("after the first document: %w; the auth file is one document", err)
	}
	cfg := &Config{tenants: make(map[string]*Tenant, len(f.Tenants))}
	for name, l := range f.Tenants {
		t, err := newTenant(name, l)
		if err != nil {
			return nil, err
		}
		cfg.tenants[name] = t
	}
	if len(f.Tokens) == 0 {
		return nil, errors.New("tokens: the auth file lists no tokens, so no request could be served")
	}
	seen := make(map[[sha256.Size]byte]int, len(f.Tokens))
	for i, tok := range f.Tokens {
		where := fmt.Sprintf("tokens[%d]", i)
		if tok.Name != "" {
			where += " (" + tok.Name + ")"
		}
		t, ok := cfg.tenants[tok.Tenant]
		switch {
		case tok.Tenant == "":
			return nil, fmt.Errorf("%s: tenant is required", where)
		case !ok:
			return nil, fmt.Errorf("%s: tenant %q is not declared under tenants", where, tok.Tenant)
		}
		hash, err := parseHash(tok.SHA256)
		if err != nil {
			return nil, fmt.Errorf("%s: sha256: %w", where, err)
		}
		if j, dup := seen[hash]; dup {
			return nil, fmt.Errorf("%s: the same sha256 as tokens[%d]", where, j)
		}
		seen[hash] = i
		if err := checkScopes(tok.Scopes); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		cfg.entries = append(cfg.entries, entry{hash: hash, principal: &Principal{Name: tok.Name, Tenant: t, scopes: tok.Scopes}})
	}
	return cfg, nil
}

// checkScopes checks a token's scopes: known names, and platform only beside a scope it
// widens, since platform alone would allow nothing but listing the tenants.
func checkScopes(scopes []Scope) error {
	if len(scopes) == 0 {
		return errors.New("scopes is required: use, admin or both (and platform)")
	}
	for _, s := range scopes {
		if s != ScopeUse && s != ScopeAdmin && s != ScopePlatform {
			return fmt.Errorf("unknown scope %q; scopes are use, admin and platform", s)
		}
	}
	if slices.Contains(scopes, ScopePlatform) && !slices.Contains(scopes, ScopeUse) && !slices.Contains(scopes, ScopeAdmin) {
		return errors.New("scopes: platform widens use and admin to every tenant in the console; list it with use, admin or both")
	}
	return nil
}

func newTenant(name string, l tenantLimits) (*Tenant, error) {
	if !ValidTenant(name) {
		return nil, fmt.Errorf("tenants: %q is not a valid tenant name: 1 to 64 of a-z 0-9 _ -, starting with a letter or digit", name)
	}
	limits := Limits{MaxResponseBytes: l.MaxResponseBytes, MaxRetention: time.Duration(l.MaxRetention), Rate: l.Rate, Burst: l.Burst,
		MaxStoredBytes: l.MaxStoredBytes, MaxRecords: l.MaxRecords}
	switch {
	case limits.MaxResponseBytes < 0:
		return nil, fmt.Errorf("tenants.%s.max_response_bytes must not be negative", name)
	case limits.MaxRetention < 0:
		return nil, fmt.Errorf("tenants.%s.max_retention must not be negative", name)
	case limits.MaxRetention > 0 && limits.MaxRetention < time.Millisecond:
		return nil, fmt.Errorf("tenants.%s.max_retention must be at least 1ms", name)
	case limits.Rate < 0 || math.IsNaN(limits.Rate) || math.IsInf(limits.Rate, 0):
		return nil, fmt.Errorf("tenants.%s.rate must be a non-negative number of requests per second", name)
	case limits.Burst < 0:
		return nil, fmt.Errorf("tenants.%s.burst must not be negative", name)
	case limits.MaxStoredBytes < 0:
		return nil, fmt.Errorf("tenants.%s.max_stored_bytes must not be negative", name)
	case limits.MaxRecords < 0:
		return nil, fmt.Errorf("tenants.%s.max_records must not be negative", name)
	case limits.Burst > 0 && limits.Rate == 0:
		return nil, fmt.Errorf("tenants.%s.burst is set without a rate", name)
	}
	t := &Tenant{Name: name, Limits: limits}
	if limits.Rate > 0 {
		if limits.Burst == 0 {
			// Without a burst, allow one second's worth of requests at once.
			t.Limits.Burst = max(1, int(math.Ceil(limits.Rate)))
		}
		t.bucket = newBucket(t.Limits.Rate, t.Limits.Burst, time.Now())
	}
	return t, nil
}

func parseHash(s string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	s = strings.TrimSpace(s)
	if s == "" {
		return h, errors.New("required: the hex SHA-256 of the token (never the token itself)")
	}
	if len(s) != 2*sha256.Size {
		return h, fmt.Errorf("%d characters; a hex SHA-256 has %d", len(s), 2*sha256.Size)
	}
	if _, err := hex.Decode(h[:], []byte(strings.ToLower(s))); err != nil {
		return h, errors.New("not hexadecimal")
	}
	return h, nil
}
