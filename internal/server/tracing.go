package server

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName names idemd's instrumentation in the spans it makes.
const tracerName = "github.com/idemd/idemd/internal/server"

// The span attributes idemd adds to the HTTP ones.
const (
	attrTenant  = attribute.Key("idemd.tenant")
	attrOutcome = attribute.Key("idemd.outcome")
)

// traceContext reads a caller's W3C traceparent and tracestate, so that a request's
// span joins the calling service's trace. Baggage is not read: it could carry anything.
var traceContext = propagation.TraceContext{}

// tracing makes a server span for each request, a child of the caller's span when the
// request carries one. The span holds only what the metrics hold (route, method,
// status, tenant, outcome): never a key, which the lookup and purge paths carry (the
// route is the template, /v1/records/:key), a payload or a token.
func tracing(provider trace.TracerProvider) echo.MiddlewareFunc {
	if provider == nil {
		return func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	tracer := provider.Tracer(tracerName)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			ctx := traceContext.Extract(req.Context(), propagation.HeaderCarrier(req.Header))
			attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(req.Method)}
			if route := c.Path(); route != "" && route != "/*" {
				attrs = append(attrs, semconv.HTTPRoute(route))
			}
			ctx, span := tracer.Start(ctx, endpointOf(c), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
			defer span.End()
			c.SetRequest(req.WithContext(ctx))

			err := next(c)

			status := c.Response().Status
			outcome, _ := c.Get(outcomeKey).(string)
			span.SetAttributes(semconv.HTTPResponseStatusCode(status), attrTenant.String(tenantLabel(c)), attrOutcome.String(outcome))
			if status >= http.StatusInternalServerError {
				span.SetStatus(codes.Error, outcome)
			}
			return err
		}
	}
}
