// Package auth decides who is calling: it reads the auth file (API tokens, stored as
// SHA-256 hashes, each bound to a tenant and a set of scopes, plus per-tenant limits),
// maps a presented bearer token to its tenant, and keeps each tenant's request rate.
//
// It knows nothing of HTTP; internal/server turns its answers into 401, 403 and 429.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// Scope is a permission a token carries. Scopes are independent: admin does not imply
// use, so a token that should do both lists both.
type Scope string

// The scopes.
const (
	// ScopeUse allows claim, complete, release, extend and lookup.
	ScopeUse Scope = "use"
	// ScopeAdmin allows purge and operations over a whole tenant.
	ScopeAdmin Scope = "admin"
	// ScopePlatform lets the operator's console act in any tenant, not only the
	// token's own, with the token's other scopes: use there to look keys up and read
	// the feed and traffic, admin there to purge. The /v1 API ignores it: a request
	// there always works in its token's tenant, so that no client's key can reach
	// another tenant's records whatever its token holds.
	ScopePlatform Scope = "platform"
)

// Errors the HTTP layer branches on.
var (
	// ErrMissingToken means the request carried no bearer token.
	ErrMissingToken = errors.New("no bearer token")
	// ErrUnknownToken means the bearer token matches no entry of the auth file.
	ErrUnknownToken = errors.New("unknown bearer token")
	// ErrForbidden means the token is valid but lacks the scope the operation needs.
	ErrForbidden = errors.New("the token lacks the scope this operation needs")
)

// ForbiddenError says which scope was missing.
type ForbiddenError struct {
	Need Scope
}

func (e *ForbiddenError) Error() string { return fmt.Sprintf("%s (%s)", ErrForbidden, e.Need) }

// Is makes errors.Is(err, ErrForbidden) true.
func (e *ForbiddenError) Is(target error) bool { return target == ErrForbidden }

// RateLimitedError reports a tenant over its request rate, and when the next request
// would be allowed.
type RateLimitedError struct {
	Tenant     string
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("tenant %s is over its request rate; retry in %s", e.Tenant, e.RetryAfter)
}

// Limits are a tenant's limits. A zero field means no limit of the tenant's own; the
// daemon-wide limits still apply.
type Limits struct {
	// MaxResponseBytes bounds a stored response (body and headers).
	MaxResponseBytes int
	// MaxRetention bounds how long a record is kept.
	MaxRetention time.Duration
	// Rate is the sustained request rate, per second; Burst is how many requests may
	// arrive at once.
	Rate  float64
	Burst int
	// MaxStoredBytes and MaxRecords are the tenant's quota on what the store keeps of
	// it: the bytes of its records (key, record, response, recovery point) and their
	// number. A tenant at either is refused new acquisitions.
	MaxStoredBytes int64
	MaxRecords     int64
}

// Tenant is a key space with its limits.
type Tenant struct {
	Name   string
	Limits Limits
	bucket *bucket
}

// Allow takes one request from the tenant's rate budget, or returns a
// *RateLimitedError saying when to come back.
func (t *Tenant) Allow() error {
	if t.bucket == nil {
		return nil
	}
	if wait := t.bucket.take(time.Now()); wait > 0 {
		return &RateLimitedError{Tenant: t.Name, RetryAfter: wait}
	}
	return nil
}

// Principal is an authenticated caller: a token's name, its tenant and scopes.
type Principal struct {
	// Name is the token's name from the auth file, for logs; it may be empty.
	Name   string
	Tenant *Tenant
	scopes []Scope
}

// Can reports whether the principal holds scope.
func (p *Principal) Can(scope Scope) bool {
	for _, s := range p.scopes {
		if s == scope {
			return true
		}
	}
	return false
}

// Authorize returns a *ForbiddenError unless the principal holds scope.
func (p *Principal) Authorize(scope Scope) error {
	if !p.Can(scope) {
		return &ForbiddenError{Need: scope}
	}
	return nil
}

// AuthorizeIn returns a *ForbiddenError unless the principal may use scope in tenant:
// it holds scope, and the tenant is its own or it holds ScopePlatform too. An empty
// scope asks only about the tenant.
func (p *Principal) AuthorizeIn(tenant string, scope Scope) error {
	if scope != "" {
		if err := p.Authorize(scope); err != nil {
			return err
		}
	}
	if tenant != p.Tenant.Name {
		return p.Authorize(ScopePlatform)
	}
	return nil
}

// Scopes returns the principal's scopes, in the auth file's order.
func (p *Principal) Scopes() []Scope { return slices.Clone(p.scopes) }

// Open is the principal of every request when idemd runs without an auth file: the
// default tenant, every scope, no limits of its own.
func Open(tenant string) *Principal {
	return &Principal{Tenant: &Tenant{Name: tenant}, scopes: []Scope{ScopeUse, ScopeAdmin}}
}

// entry is one token of the auth file.
type entry struct {
	hash      [sha256.Size]byte
	principal *Principal
}

// Config is one parsed auth file. It is never changed after Parse; a reload builds a
// new one.
type Config struct {
	entries []entry
	tenants map[string]*Tenant
}

// Tenants returns the names of the configured tenants.
func (c *Config) Tenants() []string {
	names := make([]string, 0, len(c.tenants))
	for name := range c.tenants {
		names = append(names, name)
	}
	return names
}

// Limits returns a configured tenant's limits.
func (c *Config) Limits(tenant string) (Limits, bool) {
	t, ok := c.tenants[tenant]
	if !ok {
		return Limits{}, false
	}
	return t.Limits, true
}

// Tokens returns how many tokens the configuration holds.
func (c *Config) Tokens() int { return len(c.entries) }

// Authenticate maps a bearer token to its principal, or returns ErrMissingToken or
// ErrUnknownToken.
func (c *Config) Authenticate(token string) (*Principal, error) {
	if token == "" {
		return nil, ErrMissingToken
	}
	sum := sha256.Sum256([]byte(token))
	// Every entry is compared, in constant time, whether or not an earlier one matched:
	// how long authentication takes says nothing about which hashes are stored.
	var found *Principal
	for i := range c.entries {
		if subtle.ConstantTimeCompare(sum[:], c.entries[i].hash[:]) == 1 {
			found = c.entries[i].principal
		}
	}
	if found == nil {
		return nil, ErrUnknownToken
	}
	return found, nil
}

// inherit carries rate budgets over from the configuration being replaced, so that a
// reload does not hand every tenant a fresh burst. A tenant whose rate or burst changed
// starts with a new bucket.
func (c *Config) inherit(prev *Config) {
	if prev == nil {
		return
	}
	for name, t := range c.tenants {
		old, ok := prev.tenants[name]
		if ok && old.bucket != nil && t.bucket != nil &&
			old.Limits.Rate == t.Limits.Rate && old.Limits.Burst == t.Limits.Burst {
			t.bucket = old.bucket
		}
	}
}

// Keyring holds the current configuration of an auth file and swaps it on Reload.
// Requests in flight keep the configuration they started with; the swap is atomic, so
// a reload drops no request.
type Keyring struct {
	path    string
	current atomic.Pointer[Config]
}

// Load reads the auth file at path.
func Load(path string) (*Keyring, error) {
	k := &Keyring{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the auth file again. When the file cannot be read or is invalid, the
// current configuration stays in force and the error says why.
func (k *Keyring) Reload() error {
	raw, err := os.ReadFile(k.path)
	if err != nil {
		return err
	}
	cfg, err := Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", k.path, err)
	}
	cfg.inherit(k.current.Load())
	k.current.Store(cfg)
	return nil
}

// Config returns the configuration in force.
func (k *Keyring) Config() *Config { return k.current.Load() }

// Tenants returns the names of the tenants configured now.
func (k *Keyring) Tenants() []string { return k.current.Load().Tenants() }

// Limits returns a tenant's limits under the configuration in force.
func (k *Keyring) Limits(tenant string) (Limits, bool) { return k.current.Load().Limits(tenant) }

// Authenticate maps a bearer token to its principal under the configuration in force.
func (k *Keyring) Authenticate(token string) (*Principal, error) {
	return k.current.Load().Authenticate(token)
}
