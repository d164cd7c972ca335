package server

import (
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/auth"
)

// outcomeKey is the echo context key under which a request's outcome is left where
// the request is not a *request (see setOutcome), and for the tracing span.
const outcomeKey = "idemd.outcome"

type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	waiters     prometheus.Gauge
	// authFailures counts refused credentials by reason: missing, malformed, unknown,
	// forbidden.
	authFailures *prometheus.CounterVec
	// takeovers counts leases acquired from a holder whose lease ran out (recovered).
	takeovers *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_requests_total",
			Help: "HTTP requests by endpoint, outcome (acquired, completed, failed, ok, or a problem code) and tenant (- when unauthenticated). Each item of a batch also counts as a request to its operation's endpoint.",
		}, []string{"endpoint", "outcome", "tenant"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemd_request_duration_seconds",
			Help:    "HTTP request latency by endpoint, waiting included.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"endpoint"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_store_errors_total",
			Help: "Requests answered 503 because the store was unavailable or did not replicate.",
		}, []string{"endpoint"}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemd_claim_waiters",
			Help: "Claims currently waiting (wait_ms) for a holder to finish.",
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_auth_failures_total",
			Help: "Requests refused for their credentials, by reason: missing, malformed, unknown (token) or forbidden (scope).",
		}, []string{"reason"}),
	}
	m.takeovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemd_lease_takeovers_total",
		Help: "Claims that acquired a key from a holder whose lease ran out (recovered: true), by tenant.",
	}, []string{"tenant"})
	reg.MustRegister(m.requests, m.duration, m.storeErrors, m.waiters, m.authFailures, m.takeovers)
	// The reasons are known in advance; exporting them at zero lets an alert on their
	// rate see the first failure.
	for _, reason := range []string{"missing", "malformed", "unknown", "forbidden"} {
		m.authFailures.WithLabelValues(reason)
	}
	return m
}

// otherEndpoint is the label of every request that matches no route: an unknown path
// or a method the path does not have. Both are the client's choice, so they must not
// become label values of their own.
const otherEndpoint = "other"

// endpoints lists the routes of e by method and path, each named "METHOD /path": the
// only values the endpoint label takes besides otherEndpoint. Looking a request's
// name up by its method and route builds no string.
func endpoints(e *echo.Echo) map[string]map[string]string {
	known := make(map[string]map[string]string)
	for _, r := range e.Routes() {
		if known[r.Method] == nil {
			known[r.Method] = make(map[string]string)
		}
		known[r.Method][r.Path] = r.Method + " " + r.Path
	}
	return known
}

// endpointOf names the request's route, or otherEndpoint.
func (s *Server) endpointOf(c echo.Context) string {
	if e, ok := s.endpoints[c.Request().Method][c.Path()]; ok {
		return e
	}
	return otherEndpoint
}

// front is what every request passes before its handler, in this order: instrument,
// deadlines, checkHost, authenticate. It is one middleware rather than four because
// echo chains a request's middleware anew for each request; and the steps share the
// request's route and its start. The handlers get the request as a *request, which
// carries what the steps and the handlers leave for each other.
func (s *Server) front(next echo.HandlerFunc) echo.HandlerFunc {
	return func(ec echo.Context) error {
		start := time.Now()
		c := requests.Get().(*request)
		*c = request{Context: ec}
		defer func() {
			*c = request{}
			requests.Put(c)
		}()
		endpoint := s.endpointOf(c)
		s.deadlines(c, start)
		err := s.checkHost(c, endpoint)
		if err == nil {
			err = s.authenticate(c, endpoint)
		}
		if err == nil {
			err = next(c)
		}
		s.instrument(c, endpoint, start, err)
		if s.tracing {
			// The span, made before front, reads them from echo's context.
			ec.Set(outcomeKey, c.outcome)
			if c.principal != nil {
				ec.Set(principalKey, c.principal)
			}
		}
		return nil
	}
}

// request is the echo.Context of a request past front: echo's own, and what front's
// steps and the handlers leave for each other (the principal, the outcome), kept in
// fields instead of echo's map of values, which it would make anew for each request.
// front reuses requests: nothing may keep one after its handler returns, as nothing
// may keep echo's own context.
type request struct {
	echo.Context
	principal *auth.Principal
	outcome   string
}

var requests = sync.Pool{New: func() any { return new(request) }}

// setOutcome leaves the request's outcome for the metrics: a success's outcome or a
// problem's code.
func setOutcome(c echo.Context, outcome string) {
	if r, ok := c.(*request); ok {
		r.outcome = outcome
		return
	}
	setOutcome(c, outcome)
}

// outcomeOf is the outcome setOutcome left, or "".
func outcomeOf(c echo.Context) string {
	if r, ok := c.(*request); ok {
		return r.outcome
	}
	outcome, _ := c.Get(outcomeKey).(string)
	return outcome
}

// instrument counts and times every request. It renders errors itself so that the
// status and outcome are known when it records them.
func (s *Server) instrument(c echo.Context, endpoint string, start time.Time, err error) {
	if err != nil {
		// What c.Error does, with the *request, where the outcome is left.
		s.handleError(err, c)
	}
	outcome := outcomeOf(c)
	if outcome == "" {
		outcome = "ok"
	}
	end := time.Now()
	s.metrics.requests.WithLabelValues(endpoint, outcome, tenantLabel(c)).Inc()
	s.metrics.duration.WithLabelValues(endpoint).Observe(end.Sub(start).Seconds())
	if endpoint == claimEndpoint {
		s.traffic.record(tenantLabel(c), outcome, end, end.Sub(start))
	}
}
