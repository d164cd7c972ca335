// Package server is idemd's HTTP layer: routing (generated from api/openapi.yaml),
// strict request decoding, problem+json errors and metrics. It is the only package
// that knows echo.
package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	contract "github.com/idemd/idemd/api"
	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// Engine is what the HTTP layer asks of the state machine; *engine.Service has it.
type Engine interface {
	Claim(ctx context.Context, r engine.ClaimRequest) (engine.ClaimResult, error)
	Complete(ctx context.Context, c engine.Completion) (engine.Record, error)
	Release(ctx context.Context, r engine.Release) (engine.Record, error)
	Extend(ctx context.Context, e engine.Extension) (engine.Record, error)
	Lookup(ctx context.Context, id engine.ID) (engine.Record, error)
	Purge(ctx context.Context, id engine.ID) error
	Ready(ctx context.Context) error
}

// Config configures a Server.
type Config struct {
	Limits Limits
	Logger *slog.Logger
	// Registry receives idemd's metrics and is served on /metrics. When nil the server
	// makes its own.
	Registry *prometheus.Registry
	// Auth authenticates requests. When nil the server is open: every request works in
	// the default tenant with every scope.
	Auth Authenticator
	// Retention is the engine's default retention, which a tenant's retention cap clamps;
	// zero means engine.DefaultRetention.
	Retention time.Duration
	// Tracing, when set, makes a span of each request (tracing.go); nil traces nothing.
	Tracing trace.TracerProvider
}

// Server serves the idemd API.
type Server struct {
	engine   Engine
	limits   Limits
	log      *slog.Logger
	metrics  *metrics
	registry *prometheus.Registry
	echo     *echo.Echo
	auth     Authenticator
	// open is the principal of every request when auth is nil.
	open      *auth.Principal
	retention time.Duration
	// bodyLimit bounds request bodies: a base64 response of the largest allowed size
	// and room for the rest of the JSON.
	bodyLimit int64
}

// New returns a Server over eng.
func New(eng Engine, cfg Config) *Server {
	if cfg.Limits.MaxResponseBytes <= 0 {
		cfg.Limits.MaxResponseBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Retention <= 0 {
		cfg.Retention = engine.DefaultRetention
	}
	s := &Server{
		engine:    eng,
		limits:    cfg.Limits,
		log:       cfg.Logger,
		metrics:   newMetrics(cfg.Registry),
		registry:  cfg.Registry,
		bodyLimit: int64(cfg.Limits.MaxResponseBytes)*4/3 + 64<<10,
		auth:      cfg.Auth,
		open:      auth.Open(engine.DefaultTenant),
		retention: cfg.Retention,
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(tracing(cfg.Tracing), s.instrument, s.authenticate)
	api.RegisterHandlers(e, s)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{})))
	s.echo = e
	return s
}

// ServeHTTP makes the Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

var _ api.ServerInterface = (*Server)(nil)

func (s *Server) encode(c echo.Context, v any) error {
	return json.NewEncoder(c.Response()).Encode(v)
}

func (s *Server) reply(c echo.Context, status int, outcome string, v any) error {
	c.Set(outcomeKey, outcome)
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(status)
	return s.encode(c, v)
}

// Claim implements POST /v1/claim.
func (s *Server) Claim(c echo.Context) error {
	var body api.ClaimRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	req, err := s.claimRequest(tenant(c), body)
	if err != nil {
		return err
	}
	if req.Retention, err = s.tenantRetention(c, 0); err != nil {
		return err
	}
	if req.Wait > 0 {
		s.metrics.waiters.Inc()
		defer s.metrics.waiters.Dec()
	}
	res, err := s.engine.Claim(c.Request().Context(), req)
	if err != nil {
		return err
	}
	rec := res.Record
	if res.Outcome == engine.OutcomeAcquired {
		if rec.Recovered {
			s.metrics.takeovers.WithLabelValues(tenantLabel(c)).Inc()
		}
		return s.reply(c, http.StatusCreated, string(res.Outcome), api.ClaimAcquired{
			Outcome: api.ClaimAcquiredOutcome(res.Outcome), LeaseToken: rec.LeaseToken, LeaseExpiresAt: rec.LeaseExpiresAt,
			Attempt: rec.Attempt, Recovered: rec.Recovered, ExpiresAt: rec.ExpiresAt})
	}
	return s.reply(c, http.StatusOK, string(res.Outcome), api.ClaimFinished{
		Outcome: api.ClaimFinishedOutcome(res.Outcome), Attempt: rec.Attempt,
		Response: apiResponse(rec.Response), ExpiresAt: rec.ExpiresAt})
}

// Complete implements POST /v1/complete.
func (s *Server) Complete(c echo.Context) error {
	var body api.CompleteRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	req, err := s.completion(tenant(c), body)
	if err != nil {
		return err
	}
	if err := checkTenantResponse(c, "response", &req.Response); err != nil {
		return err
	}
	if req.Retention, err = s.tenantRetention(c, req.Retention); err != nil {
		return err
	}
	rec, err := s.engine.Complete(c.Request().Context(), req)
	if err != nil {
		return err
	}
	// The caller sent the response; echoing up to a megabyte back would only cost.
	rec.Response = nil
	return s.reply(c, http.StatusOK, "ok", apiRecord(rec))
}

// Release implements POST /v1/release.
func (s *Server) Release(c echo.Context) error {
	var body api.ReleaseRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	req, err := s.release(tenant(c), body)
	if err != nil {
		return err
	}
	if err := checkTenantResponse(c, "response", req.Response); err != nil {
		return err
	}
	if req.Retention, err = s.tenantRetention(c, req.Retention); err != nil {
		return err
	}
	rec, err := s.engine.Release(c.Request().Context(), req)
	if err != nil {
		return err
	}
	rec.Response = nil
	return s.reply(c, http.StatusOK, "ok", apiRecord(rec))
}

// Extend implements POST /v1/extend.
func (s *Server) Extend(c echo.Context) error {
	var body api.ExtendRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	req, err := s.extension(tenant(c), body)
	if err != nil {
		return err
	}
	rec, err := s.engine.Extend(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return s.reply(c, http.StatusOK, "ok", api.LeaseExtended{LeaseExpiresAt: rec.LeaseExpiresAt, ExpiresAt: rec.ExpiresAt})
}

// Lookup implements GET /v1/records/{key}.
func (s *Server) Lookup(c echo.Context, key string) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	rec, err := s.engine.Lookup(c.Request().Context(), engine.ID{Tenant: tenant(c), Key: key})
	if err != nil {
		return err
	}
	return s.reply(c, http.StatusOK, "ok", apiRecord(rec))
}

// Purge implements DELETE /v1/records/{key}.
func (s *Server) Purge(c echo.Context, key string) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	if err := s.engine.Purge(c.Request().Context(), engine.ID{Tenant: tenant(c), Key: key}); err != nil {
		return err
	}
	c.Set(outcomeKey, "ok")
	return c.NoContent(http.StatusNoContent)
}

// Openapi implements GET /openapi.yaml: the contract this daemon serves.
func (s *Server) Openapi(c echo.Context) error {
	c.Set(outcomeKey, "ok")
	return c.Blob(http.StatusOK, "application/yaml", contract.OpenAPI)
}

// Healthz implements GET /healthz: the process is up.
func (s *Server) Healthz(c echo.Context) error {
	return s.reply(c, http.StatusOK, "ok", api.Health{Status: "up"})
}

// Readyz implements GET /readyz: the store takes writes.
func (s *Server) Readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := s.engine.Ready(ctx); err != nil {
		return err
	}
	return s.reply(c, http.StatusOK, "ok", api.Health{Status: "ready"})
}

func apiResponse(r *engine.Response) *api.StoredResponse {
	if r == nil {
		return nil
	}
	out := &api.StoredResponse{Status: r.Status}
	if r.Headers != nil {
		out.Headers = &r.Headers
	}
	body := r.Body
	if body == nil {
		body = []byte{}
	}
	out.Body = &body
	return out
}

func apiRecord(r engine.Record) api.KeyRecord {
	out := api.KeyRecord{
		Key:       r.ID.Key,
		State:     string(r.State),
		Attempt:   r.Attempt,
		CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt,
		ExpiresAt: r.ExpiresAt,
		Response:  apiResponse(r.Response),
	}
	if r.Fingerprint != "" {
		out.Fingerprint = &r.Fingerprint
	}
	if r.Owner != "" {
		out.Owner = &r.Owner
	}
	if !r.LeaseExpiresAt.IsZero() {
		out.LeaseExpiresAt = &r.LeaseExpiresAt
	}
	return out
}
