package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/server"
)

// propagating is what an OpenTelemetry-instrumented HTTP transport does (otelhttp's,
// say): it writes the context's span into the request as a W3C traceparent.
type propagating struct{ next http.RoundTripper }

func (p propagating) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	return p.next.RoundTrip(r)
}

// tracedDaemon serves the API over the embedded store with the test auth file, making
// spans into an in-memory recorder.
func tracedDaemon(t *testing.T) (string, *tracetest.SpanRecorder) {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(authPath, []byte(testAuthFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(authPath)
	if err != nil {
		t.Fatal(err)
	}
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	srv := server.New(engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{Auth: keyring, Tracing: provider})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs.URL, recorder
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.Emit()
	}
	return out
}

// TestTracing calls the daemon through the Go SDK from inside a span of the calling
// service: each request's span is a child of the caller's, says the route, tenant and
// outcome, and holds no key, token or payload.
func TestTracing(t *testing.T) {
	url, recorder := tracedDaemon(t)
	const key, payload = "secret-order-key-42", "secret-payload-bytes"
	client, err := idem.New(url, idem.WithToken(alphaUse), idem.WithHTTPClient(&http.Client{Transport: propagating{http.DefaultTransport}}))
	if err != nil {
		t.Fatal(err)
	}

	// The calling service's span, as its own tracer would have started it.
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), caller)
	cl, err := client.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Complete(ctx, key, cl.Token, idem.Response{Status: 201, Body: []byte(payload)}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Lookup(ctx, key); err != nil {
		t.Fatal(err)
	}
	// Not the caller's trace, and refused: a new root span.
	stranger, _ := idem.New(url, idem.WithToken("no-such-token"))
	if _, err := stranger.Lookup(context.Background(), key); err == nil {
		t.Fatal("an unknown token was accepted")
	}

	spans := recorder.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want one per request (4)", len(spans))
	}
	want := []struct {
		name, route, status, tenant, outcome string
		child                                bool
	}{
		{"POST /v1/claim", "/v1/claim", "201", "alpha", "acquired", true},
		{"POST /v1/complete", "/v1/complete", "200", "alpha", "ok", true},
		{"GET /v1/records/:key", "/v1/records/:key", "200", "alpha", "ok", true},
		{"GET /v1/records/:key", "/v1/records/:key", "401", "-", "unauthenticated", false},
	}
	for i, w := range want {
		s, a := spans[i], attrs(spans[i])
		if s.Name() != w.name || a["http.route"] != w.route || a["http.response.status_code"] != w.status ||
			a["idemd.tenant"] != w.tenant || a["idemd.outcome"] != w.outcome || s.SpanKind() != trace.SpanKindServer {
			t.Errorf("span %d: %s %v, want %+v", i, s.Name(), a, w)
		}
		if child := s.Parent().SpanID() == caller.SpanID() && s.SpanContext().TraceID() == caller.TraceID(); child != w.child {
			t.Errorf("span %d (%s): child of the caller's span %v, want %v (parent %s)", i, s.Name(), child, w.child, s.Parent().SpanID())
		}
		if s.Status().Code == codes.Error {
			t.Errorf("span %d: status %v for a %s", i, s.Status(), w.status)
		}
		for k, v := range a {
			for _, secret := range []string{key, payload, alphaUse, "no-such-token", tokenHash(alphaUse), cl.Token} {
				if strings.Contains(v, secret) || strings.Contains(s.Name(), secret) {
					t.Errorf("span %d attribute %s holds %q", i, k, secret)
				}
			}
		}
	}
}

// TestTracingOff checks that a server without a provider traces nothing and still
// serves a request that carries a traceparent.
func TestTracingOff(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	hs := httptest.NewServer(server.New(engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{}))
	defer hs.Close()
	req, _ := http.NewRequest(http.MethodGet, hs.URL+"/v1/records/k", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("lookup with a traceparent and no tracing: %d", resp.StatusCode)
	}
}
