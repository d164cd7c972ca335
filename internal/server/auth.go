package server

import (
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// Authenticator maps a bearer token to the principal presenting it; *auth.Keyring has
// it. It returns auth.ErrMissingToken or auth.ErrUnknownToken when it cannot.
type Authenticator interface {
	Authenticate(token string) (*auth.Principal, error)
}

// principalKey is the echo context key under which the authenticated principal is
// left where the request is not a *request (see setPrincipal), and for the tracing span.
const principalKey = "idemd.principal"

// noTenant is the tenant label of requests that have none: unauthenticated ones and
// the open endpoints. Tenant names start with a letter or digit, so it names no tenant.
const noTenant = "-"

// openPaths answer without a token: probes and scrapers carry none, and they reveal
// nothing about any tenant's records.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true, "/openapi.yaml": true}

// routeScopes is the scope each API route needs. Every route of the API is listed (a
// test holds that); a route missing here would need a valid token of any scope.
var routeScopes = map[string]auth.Scope{
	"POST /v1/claim":           auth.ScopeUse,
	"POST /v1/complete":        auth.ScopeUse,
	"POST /v1/release":         auth.ScopeUse,
	"POST /v1/extend":          auth.ScopeUse,
	"POST /v1/recovery-point":  auth.ScopeUse,
	"GET /v1/abandoned":        auth.ScopeUse,
	batchEndpoint:              auth.ScopeUse,
	"GET /v1/records/:key":     auth.ScopeUse,
	"PUT /v1/keys/:key/result": auth.ScopeUse,
	"GET /v1/keys/:key/result": auth.ScopeUse,
	"DELETE /v1/records/:key":  auth.ScopeAdmin,
	"GET /v1/admin/records":    auth.ScopeAdmin,
	"POST /v1/admin/records":   auth.ScopeAdmin,
	"GET /v1/admin/backup":     auth.ScopeAdmin,
}

// authenticate decides who sends a request before anything else looks at it: it
// resolves the bearer token to a principal, checks the route's scope, and takes the
// request from the tenant's rate budget (a batch takes each of its items instead). Without an Authenticator every request is the
// open principal of the default tenant.
func (s *Server) authenticate(c echo.Context, endpoint string) error {
	if openPaths[c.Path()] || consolePaths[c.Path()] {
		return nil
	}
	p, err := s.principal(c, endpoint)
	if err != nil {
		return err
	}
	setPrincipal(c, p)
	if scope, ok := routeScopes[endpoint]; ok {
		if err := p.Authorize(scope); err != nil {
			s.metrics.authFailures.WithLabelValues("forbidden").Inc()
			s.log.Warn("request refused: missing scope", "reason", "forbidden", "tenant", p.Tenant.Name,
				"token", p.Name, "scope", scope, "endpoint", endpoint, "remote", c.Request().RemoteAddr)
			return err
		}
	}
	if endpoint != batchEndpoint {
		if err := p.Tenant.Allow(); err != nil {
			return err
		}
	}
	return nil
}

// principal resolves the request's bearer token. Failures are counted and logged here,
// by reason, and never with the token.
func (s *Server) principal(c echo.Context, endpoint string) (*auth.Principal, error) {
	if s.auth == nil {
		return s.open, nil
	}
	r := c.Request()
	token, reason := bearer(r.Header.Get(echo.HeaderAuthorization))
	var p *auth.Principal
	var err error
	if reason == "" {
		if p, err = s.auth.Authenticate(token); err != nil {
			reason = "unknown"
		}
	} else {
		err = auth.ErrMissingToken
	}
	if err != nil {
		s.metrics.authFailures.WithLabelValues(reason).Inc()
		s.log.Warn("request refused: not authenticated", "reason", reason,
			"endpoint", endpoint, "remote", r.RemoteAddr)
		return nil, err
	}
	return p, nil
}

// bearer extracts the token of an Authorization header, or says why there is none:
// "missing" without the header, "malformed" for another scheme or an empty token.
func bearer(header string) (token, reason string) {
	if header == "" {
		return "", "missing"
	}
	scheme, token, ok := strings.Cut(header, " ")
	token = strings.TrimSpace(token)
	// RFC 9110 makes the scheme name case-insensitive.
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", "malformed"
	}
	return token, ""
}

// principalOf is the principal the middleware authenticated. Every route but the open
// ones passes the middleware, so a handler without one is a wiring bug, not a request
// to serve in some default key space.
func principalOf(c echo.Context) *auth.Principal {
	p, ok := authenticated(c)
	if !ok {
		panic("server: " + c.Request().Method + " " + c.Path() + " reached its handler without authentication")
	}
	return p
}

// setPrincipal leaves the authenticated principal for the handlers and the metrics.
func setPrincipal(c echo.Context, p *auth.Principal) {
	if r, ok := c.(*request); ok {
		r.principal = p
		return
	}
	c.Set(principalKey, p)
}

// authenticated is the principal setPrincipal left, if any.
func authenticated(c echo.Context) (*auth.Principal, bool) {
	if r, ok := c.(*request); ok {
		return r.principal, r.principal != nil
	}
	p, ok := c.Get(principalKey).(*auth.Principal)
	return p, ok
}

// tenant is the key space a request works in: its principal's tenant, never anything
// the request names.
func tenant(c echo.Context) string { return principalOf(c).Tenant.Name }

// tenantLabel is the tenant as a metric label: bounded by the tenants of the auth file.
func tenantLabel(c echo.Context) string {
	if p, ok := authenticated(c); ok {
		return p.Tenant.Name
	}
	return noTenant
}

// caps are the request's tenant's caps on what it stores, which the engine applies.
func caps(c echo.Context) engine.Caps { return capsOf(principalOf(c).Tenant.Limits) }

// capsOf are a tenant's caps from its limits in the auth file.
func capsOf(l auth.Limits) engine.Caps {
	return engine.Caps{MaxResponseBytes: l.MaxResponseBytes, MaxRetention: l.MaxRetention,
		MaxStoredBytes: l.MaxStoredBytes, MaxRecords: l.MaxRecords}
}
