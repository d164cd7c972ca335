package server

import (
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// outcomeKey is the echo context key under which a handler or the error handler leaves
// the request's outcome for the metrics.
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
			Help: "HTTP requests by endpoint, outcome (acquired, completed, failed, ok, or a problem code) and tenant (- when unauthenticated).",
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

// endpointOf names the route, bounded by the routes that exist.
func endpointOf(c echo.Context) string {
	if p := c.Path(); p != "" && p != "/*" {
		return c.Request().Method + " " + p
	}
	return "other"
}

// instrument counts and times every request. It renders errors itself so that the
// status and outcome are known when it records them.
func (s *Server) instrument(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		if err := next(c); err != nil {
			c.Error(err)
		}
		endpoint := endpointOf(c)
		outcome, _ := c.Get(outcomeKey).(string)
		if outcome == "" {
			outcome = "ok"
		}
		s.metrics.requests.WithLabelValues(endpoint, outcome, tenantLabel(c)).Inc()
		s.metrics.duration.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
		return nil
	}
}
