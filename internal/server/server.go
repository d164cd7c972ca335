// Package server is idemd's HTTP layer: routing (generated from api/openapi.yaml),
// strict request decoding, problem+json errors and metrics. It is the only package
// that knows echo.
package server

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
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
	Mark(ctx context.Context, m engine.Mark) (engine.Record, error)
	Lookup(ctx context.Context, id engine.ID) (engine.Record, error)
	LookupResult(ctx context.Context, id engine.ID) (engine.Record, *engine.ResultBody, error)
	Inspect(ctx context.Context, id engine.ID) (engine.Record, error)
	Abandoned(ctx context.Context, q engine.AbandonedQuery) (engine.AbandonedPage, error)
	Purge(ctx context.Context, id engine.ID) error
	Ready(ctx context.Context) error
	Export(ctx context.Context, fn func(engine.Exported) error) error
	Import(ctx context.Context, e engine.Exported, caps engine.Caps) (engine.ImportOutcome, error)
	Backup(ctx context.Context, w io.Writer, size func(int64)) (int64, error)
}

// Config configures a Server.
type Config struct {
	Limits Limits
	// LargeBodies bounds the requests whose bodies are over what a result of
	// Limits.MaxResponseBytes needs that are read at once, when Limits.MaxBlobBytes
	// allows such bodies; DefaultLargeBodies when zero. More wait their turn.
	LargeBodies int
	Logger      *slog.Logger
	// Registry receives idemd's metrics and is served on /metrics. When nil the server
	// makes its own.
	Registry *prometheus.Registry
	// Auth authenticates requests. When nil the server is open: every request works in
	// the default tenant with every scope.
	Auth Authenticator
	// AllowedHosts are the names, besides IP literals and localhost, that an open server
	// answers requests to in their Host header (host.go); without Auth no other name
	// reaches the API. With Auth they play no part.
	AllowedHosts []string
	// BodyTimeout bounds how long a request's body may take to arrive, counted from
	// the start of the request; WriteTimeout bounds writing an answer, counted from its
	// first byte, so that a claim's wait is not cut short. Zero means DefaultTimeout.
	BodyTimeout  time.Duration
	WriteTimeout time.Duration
	// Tracing, when set, makes a span of each request (tracing.go); nil traces nothing.
	Tracing trace.TracerProvider
	// Console, when enabled, serves the operator's console (console.go).
	Console Console
	// MetricsTenantUsage puts every tenant's records and stored bytes on the open
	// scrape of /metrics. Without it, the scrape names them only to a bearer token:
	// a tenant's token its own tenant's, a platform token every tenant's.
	MetricsTenantUsage bool
}

// DefaultTimeout is the default body and write timeout: a client slower than that on
// a body of a few megabytes is indistinguishable from one holding a connection open.
const DefaultTimeout = 10 * time.Second

// Server serves the idemd API.
type Server struct {
	engine Engine
	limits Limits
	// tenantLimits are each tenant's limits in the auth file, for an import that
	// writes records of tenants other than the caller's.
	tenantLimits func(string) (auth.Limits, bool)
	log          *slog.Logger
	metrics      *metrics
	registry     *prometheus.Registry
	// abandoned counts the abandoned keys for the metrics and the console.
	abandoned *abandonedCollector
	echo      *echo.Echo
	auth      Authenticator
	// open is the principal of every request when auth is nil, and hosts are the
	// names such a request may be sent to.
	open  *auth.Principal
	hosts hosts
	// endpoints are the routes, the values of the endpoint label.
	endpoints    map[string]map[string]string
	bodyTimeout  time.Duration
	writeTimeout time.Duration
	// bodyLimit bounds the bodies that carry a stored response (complete, release,
	// batch): a base64 response of the largest allowed size and room for the rest of
	// the JSON. smallBodyLimit bounds the others, and any body over it waits for one
	// of largeBodies' places (nil without a blob store, whose results can be large).
	bodyLimit      int64
	smallBodyLimit int64
	largeBodies    chan struct{}
	// traffic counts claims for the console's charts, and console is what its
	// endpoints read; both nil without the console.
	traffic *traffic
	console *consoleState
	// tracing is whether requests are traced (tracing.go).
	tracing bool
}

// New returns a Server over eng.
func New(eng Engine, cfg Config) *Server {
	if cfg.Limits.MaxResponseBytes <= 0 {
		cfg.Limits.MaxResponseBytes = 1 << 20
	}
	if cfg.Limits.MaxPointBytes <= 0 {
		cfg.Limits.MaxPointBytes = engine.DefaultMaxPointBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Limits.MaxBlobBytes > 0 && cfg.LargeBodies <= 0 {
		cfg.LargeBodies = DefaultLargeBodies
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{
		engine:         eng,
		limits:         cfg.Limits,
		log:            cfg.Logger,
		metrics:        newMetrics(cfg.Registry),
		registry:       cfg.Registry,
		bodyLimit:      int64(max(cfg.Limits.MaxResponseBytes, cfg.Limits.MaxBlobBytes))*4/3 + 64<<10,
		smallBodyLimit: int64(cfg.Limits.MaxResponseBytes)*4/3 + 64<<10,
		auth:           cfg.Auth,
		open:           auth.Open(engine.DefaultTenant),
		hosts:          newHosts(cfg.AllowedHosts),

		tracing: cfg.Tracing != nil,

		bodyTimeout:  cmp.Or(cfg.BodyTimeout, DefaultTimeout),
		writeTimeout: cmp.Or(cfg.WriteTimeout, DefaultTimeout),
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(tracing(cfg.Tracing, s.endpointOf), s.front)
	api.RegisterHandlers(e, s)
	tenants := func() []string { return []string{engine.DefaultTenant} }
	if t, ok := cfg.Auth.(interface{ Tenants() []string }); ok {
		tenants = t.Tenants
	}
	s.abandoned = newAbandonedCollector(eng, tenants)
	cfg.Registry.MustRegister(s.abandoned)
	limits := func(string) (auth.Limits, bool) { return auth.Limits{}, false }
	if l, ok := cfg.Auth.(interface {
		Limits(string) (auth.Limits, bool)
	}); ok {
		limits = l.Limits
	}
	s.tenantLimits = limits
	if u, ok := eng.(usageEngine); ok {
		cfg.Registry.MustRegister(newUsageCollector(u, tenants, limits))
	}
	if cfg.Console.Enabled {
		s.registerConsole(e, cfg.Console, tenants)
		s.console.limits = limits
	} else {
		registerConsoleOff(e)
	}
	e.GET("/metrics", s.metricsHandler(cfg.Registry, cfg.MetricsTenantUsage))
	s.echo = e
	s.endpoints = endpoints(e)
	if cfg.Limits.MaxBlobBytes > 0 {
		s.largeBodies = make(chan struct{}, cfg.LargeBodies)
	}
	return s
}

// deadlines bounds the connection's reads while the request body arrives, from the
// request's start, and its writes once the answer starts. The read deadline also
// bounds net/http's discarding of a body nobody read, as after a 401. decodeJSON lifts
// it once the body is in: net/http's background read, which notices a client hanging
// up, would otherwise end a claim still waiting at the deadline.
func (s *Server) deadlines(c echo.Context, start time.Time) {
	w := c.Response().Writer
	var bodyDeadline time.Time
	if c.Request().Body != http.NoBody {
		bodyDeadline = start.Add(s.bodyTimeout)
		_ = setReadDeadline(w, bodyDeadline)
	}
	c.Response().Before(func() {
		// net/http discards an unread body before it sends the answer's header, for
		// up to the body deadline; the write deadline starts after that.
		_ = setWriteDeadline(w, later(time.Now(), bodyDeadline).Add(s.writeTimeout))
	})
}

// setReadDeadline and setWriteDeadline are http.ResponseController's, without making
// a controller for each call.
func setReadDeadline(w http.ResponseWriter, t time.Time) error {
	for {
		switch u := w.(type) {
		case interface{ SetReadDeadline(time.Time) error }:
			return u.SetReadDeadline(t)
		case interface{ Unwrap() http.ResponseWriter }:
			w = u.Unwrap()
		default:
			return http.ErrNotSupported
		}
	}
}

func setWriteDeadline(w http.ResponseWriter, t time.Time) error {
	for {
		switch u := w.(type) {
		case interface{ SetWriteDeadline(time.Time) error }:
			return u.SetWriteDeadline(t)
		case interface{ Unwrap() http.ResponseWriter }:
			w = u.Unwrap()
		default:
			return http.ErrNotSupported
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// ServeHTTP makes the Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

var _ api.ServerInterface = (*Server)(nil)

// encode writes v as JSON and a newline, in one write, as json.Encoder does; the
// usual answers without reflection (appendAnswer).
func (s *Server) encode(c echo.Context, v any) error {
	buf := answerBuffers.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= 4<<10 {
			answerBuffers.Put(buf)
		}
	}()
	b, ok := appendAnswer((*buf)[:0], v)
	*buf = b
	if !ok {
		return json.NewEncoder(c.Response()).Encode(v)
	}
	_, err := c.Response().Write(b)
	return err
}

// answer is an operation's success: its status, the outcome the metrics count, and
// its body. A single call writes it as the response; a batch puts it in the item's
// result.
type answer struct {
	status  int
	outcome string
	body    any
}

func (s *Server) reply(c echo.Context, a answer) error {
	setOutcome(c, a.outcome)
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(a.status)
	return s.encode(c, a.body)
}

// Claim implements POST /v1/claim.
func (s *Server) Claim(c echo.Context) error {
	var body api.ClaimRequest
	if err := decodeJSON(c.Request(), c.Response(), s.smallBodyLimit, &body); err != nil {
		return err
	}
	req, err := s.claimRequest(tenant(c), body)
	if err != nil {
		return err
	}
	if req.Wait > 0 {
		s.metrics.waiters.Inc()
		defer s.metrics.waiters.Dec()
	}
	a, err := s.claim(c, req)
	if err != nil {
		return err
	}
	return s.reply(c, a)
}

func (s *Server) claim(c echo.Context, req engine.ClaimRequest) (answer, error) {
	req.Caps = caps(c)
	res, err := s.engine.Claim(c.Request().Context(), req)
	if err != nil {
		return answer{}, err
	}
	rec := res.Record
	if res.Outcome == engine.OutcomeAcquired {
		if rec.Recovered {
			s.metrics.takeovers.WithLabelValues(tenantLabel(c)).Inc()
		}
		return answer{http.StatusCreated, string(res.Outcome), api.ClaimAcquired{
			Outcome: api.ClaimAcquiredOutcome(res.Outcome), LeaseToken: rec.LeaseToken, LeaseExpiresAt: rec.LeaseExpiresAt,
			Attempt: rec.Attempt, Recovered: rec.Recovered, ExpiresAt: rec.ExpiresAt,
			RecoveryPoint: apiPoint(rec.RecoveryPoint)}}, nil
	}
	return answer{http.StatusOK, string(res.Outcome), api.ClaimFinished{
		Outcome: api.ClaimFinishedOutcome(res.Outcome), Attempt: rec.Attempt,
		Response: apiResponse(rec.Response), ExpiresAt: rec.ExpiresAt}}, nil
}

// DefaultLargeBodies is how many large request bodies are read at once by default.
const DefaultLargeBodies = 8

// admitBody waits, for a request body larger than smallBodyLimit (or of unknown
// length) on a daemon that takes large results, for one of the large bodies' places,
// so that at most so many large bodies are in memory at once. release gives it back.
func (s *Server) admitBody(c echo.Context) (release func(), err error) {
	r := c.Request()
	if s.largeBodies == nil || (r.ContentLength >= 0 && r.ContentLength <= s.smallBodyLimit) {
		return func() {}, nil
	}
	select {
	case s.largeBodies <- struct{}{}:
		return func() { <-s.largeBodies }, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

// Complete implements POST /v1/complete.
func (s *Server) Complete(c echo.Context) error {
	release, err := s.admitBody(c)
	if err != nil {
		return err
	}
	defer release()
	var body api.CompleteRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	req, err := s.completion(tenant(c), body)
	if err != nil {
		return err
	}
	a, err := s.complete(c, req)
	if err != nil {
		return err
	}
	return s.reply(c, a)
}

func (s *Server) complete(c echo.Context, req engine.Completion) (answer, error) {
	req.Caps = caps(c)
	rec, err := s.engine.Complete(c.Request().Context(), req)
	if err != nil {
		return answer{}, err
	}
	// The caller sent the response; echoing up to a megabyte back would only cost.
	rec.Response = nil
	return answer{http.StatusOK, "ok", apiRecord(rec)}, nil
}

// Release implements POST /v1/release.
func (s *Server) Release(c echo.Context) error {
	admitted, err := s.admitBody(c)
	if err != nil {
		return err
	}
	defer admitted()
	var body api.ReleaseRequest
	if err := decodeJSON(c.Request(), c.Response(), s.bodyLimit, &body); err != nil {
		return err
	}
	req, err := s.release(tenant(c), body)
	if err != nil {
		return err
	}
	a, err := s.releaseKey(c, req)
	if err != nil {
		return err
	}
	return s.reply(c, a)
}

func (s *Server) releaseKey(c echo.Context, req engine.Release) (answer, error) {
	req.Caps = caps(c)
	rec, err := s.engine.Release(c.Request().Context(), req)
	if err != nil {
		return answer{}, err
	}
	rec.Response = nil
	return answer{http.StatusOK, "ok", apiRecord(rec)}, nil
}

// Extend implements POST /v1/extend.
func (s *Server) Extend(c echo.Context) error {
	var body api.ExtendRequest
	if err := decodeJSON(c.Request(), c.Response(), s.smallBodyLimit, &body); err != nil {
		return err
	}
	req, err := s.extension(tenant(c), body)
	if err != nil {
		return err
	}
	a, err := s.extend(c, req)
	if err != nil {
		return err
	}
	return s.reply(c, a)
}

func (s *Server) extend(c echo.Context, req engine.Extension) (answer, error) {
	rec, err := s.engine.Extend(c.Request().Context(), req)
	if err != nil {
		return answer{}, err
	}
	return answer{http.StatusOK, "ok", api.LeaseExtended{LeaseExpiresAt: rec.LeaseExpiresAt, ExpiresAt: rec.ExpiresAt}}, nil
}

// RecordRecoveryPoint implements POST /v1/recovery-point.
func (s *Server) RecordRecoveryPoint(c echo.Context) error {
	var body api.RecoveryPointRequest
	if err := decodeJSON(c.Request(), c.Response(), s.smallBodyLimit, &body); err != nil {
		return err
	}
	req, err := s.mark(tenant(c), body)
	if err != nil {
		return err
	}
	req.Caps = caps(c)
	rec, err := s.engine.Mark(c.Request().Context(), req)
	if err != nil {
		return err
	}
	return s.reply(c, answer{http.StatusOK, "ok", apiRecord(rec)})
}

// ListAbandoned implements GET /v1/abandoned. The store's cursor travels base64url
// encoded, so that it is a plain token in a query string whatever the store puts in it.
func (s *Server) ListAbandoned(c echo.Context, params api.ListAbandonedParams) error {
	q, err := abandonedQuery(tenant(c), params, time.Now())
	if err != nil {
		return err
	}
	page, err := s.engine.Abandoned(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return s.reply(c, answer{http.StatusOK, "ok", abandonedKeys(page)})
}

// abandonedKeys is a page of the feed as the API shows it.
func abandonedKeys(page engine.AbandonedPage) api.AbandonedKeys {
	out := api.AbandonedKeys{Keys: make([]api.AbandonedKey, 0, len(page.Keys))}
	for _, k := range page.Keys {
		a := api.AbandonedKey{Key: k.Key, Attempt: k.Attempt, LeaseExpiredAt: k.LeaseExpiredAt}
		if k.Owner != "" {
			a.Owner = &k.Owner
		}
		if k.Fingerprint != "" {
			a.Fingerprint = &k.Fingerprint
		}
		if k.Point != "" {
			a.RecoveryPoint = &k.Point
		}
		out.Keys = append(out.Keys, a)
	}
	if page.Next != "" {
		next := base64.RawURLEncoding.EncodeToString([]byte(page.Next))
		out.NextCursor = &next
	}
	return out
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
	return s.reply(c, answer{http.StatusOK, "ok", apiRecord(rec)})
}

// Purge implements DELETE /v1/records/{key}.
func (s *Server) Purge(c echo.Context, key string) error {
	if err := validKey("key (path)", key); err != nil {
		return err
	}
	if err := s.engine.Purge(c.Request().Context(), engine.ID{Tenant: tenant(c), Key: key}); err != nil {
		return err
	}
	s.logPurge(c, tenant(c), key, "api")
	setOutcome(c, "ok")
	return c.NoContent(http.StatusNoContent)
}

// Openapi implements GET /openapi.yaml: the contract this daemon serves.
func (s *Server) Openapi(c echo.Context) error {
	setOutcome(c, "ok")
	return c.Blob(http.StatusOK, "application/yaml", contract.OpenAPI)
}

// Healthz implements GET /healthz: the process is up.
func (s *Server) Healthz(c echo.Context) error {
	return s.reply(c, answer{http.StatusOK, "ok", api.Health{Status: "up"}})
}

// Readyz implements GET /readyz: the store takes writes. The engine bounds the check
// by its store deadline, like every store call.
func (s *Server) Readyz(c echo.Context) error {
	if err := s.engine.Ready(c.Request().Context()); err != nil {
		return err
	}
	return s.reply(c, answer{http.StatusOK, "ok", api.Health{Status: "ready"}})
}

func apiResponse(r *engine.Response) *api.StoredResponse {
	if r == nil {
		return nil
	}
	out := &api.StoredResponse{Status: r.Status}
	if env := r.Sealed(); env != nil {
		out.Sealed = &env
		return out
	}
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

func apiPoint(p *engine.RecoveryPoint) *api.RecoveryPoint {
	if p == nil {
		return nil
	}
	out := &api.RecoveryPoint{Name: p.Name, Attempt: p.Attempt, RecordedAt: p.RecordedAt}
	if len(p.Data) > 0 {
		out.Data = &p.Data
	}
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

		RecoveryPoint: apiPoint(r.RecoveryPoint),
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
