package server

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// Authenticator maps a bearer token to the principal presenting it; *auth.Keyring has
// it. It returns auth.ErrMissingToken or auth.ErrUnknownToken when it cannot.
type Authenticator interface {
	Authenticate(token string) (*auth.Principal, error)
}

// principalKey is the echo context key under which the middleware leaves the
// authenticated principal for the handlers and the metrics.
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
	"POST /v1/claim":          auth.ScopeUse,
	"POST /v1/complete":       auth.ScopeUse,
	"POST /v1/release":        auth.ScopeUse,
	"POST /v1/extend":         auth.ScopeUse,
	"GET /v1/records/:key":    auth.ScopeUse,
	"DELETE /v1/records/:key": auth.ScopeAdmin,
}

// authenticate decides who sends a request before anything else looks at it: it
// resolves the bearer token to a principal, checks the route's scope, and takes the
// request from the tenant's rate budget. Without an Authenticator every request is the
// open principal of the default tenant.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if openPaths[c.Path()] {
			return next(c)
		}
		p, err := s.principal(c.Request())
		if err != nil {
			return err
		}
		c.Set(principalKey, p)
		if scope, ok := routeScopes[endpointOf(c)]; ok {
			if err := p.Authorize(scope); err != nil {
				s.metrics.authFailures.WithLabelValues("forbidden").Inc()
				s.log.Warn("request refused: missing scope", "reason", "forbidden", "tenant", p.Tenant.Name,
					"token", p.Name, "scope", scope, "endpoint", endpointOf(c), "remote", c.Request().RemoteAddr)
				return err
			}
		}
		if err := p.Tenant.Allow(); err != nil {
			return err
		}
		return next(c)
	}
}

// principal resolves the request's bearer token. Failures are counted and logged here,
// by reason, and never with the token.
func (s *Server) principal(r *http.Request) (*auth.Principal, error) {
	if s.auth == nil {
		return s.open, nil
	}
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
			"endpoint", r.Method+" "+r.URL.Path, "remote", r.RemoteAddr)
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
	p, ok := c.Get(principalKey).(*auth.Principal)
	if !ok {
		panic("server: " + endpointOf(c) + " reached its handler without authentication")
	}
	return p
}

// tenant is the key space a request works in: its principal's tenant, never anything
// the request names.
func tenant(c echo.Context) string { return principalOf(c).Tenant.Name }

// tenantLabel is the tenant as a metric label: bounded by the tenants of the auth file.
func tenantLabel(c echo.Context) string {
	if p, ok := c.Get(principalKey).(*auth.Principal); ok {
		return p.Tenant.Name
	}
	return noTenant
}

// checkTenantResponse holds a stored response to the tenant's own size limit, which can
// only lower the daemon-wide one already checked while decoding.
func checkTenantResponse(c echo.Context, field string, r *engine.Response) error {
	t := principalOf(c).Tenant
	limit := t.Limits.MaxResponseBytes
	if limit <= 0 || r == nil {
		return nil
	}
	if n := r.Size(); n > limit {
		return &problem{status: http.StatusRequestEntityTooLarge, code: codePayloadTooLarge,
			detail: fmt.Sprintf("%s is %d bytes (body and headers), over tenant %s's limit of %d", field, n, t.Name, limit)}
	}
	return nil
}

// tenantRetention applies the tenant's retention cap to a retention the request asked
// for (0 when it did not say). An explicit retention_ms over the cap is refused, so a
// client never believes a result is kept longer than it is; the daemon's default is
// clamped to the cap, so clients that do not say keep working.
func (s *Server) tenantRetention(c echo.Context, asked time.Duration) (time.Duration, error) {
	t := principalOf(c).Tenant
	limit := t.Limits.MaxRetention
	switch {
	case limit <= 0:
		return asked, nil
	case asked == 0:
		return min(s.retention, limit), nil
	case asked > limit:
		return 0, invalid("retention_ms is %d, over tenant %s's limit of %d", asked.Milliseconds(), t.Name, limit.Milliseconds())
	}
	return asked, nil
}
