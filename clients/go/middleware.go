package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// The headers of the Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header).
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed marks an answer replayed from the stored first one.
	HeaderReplayed = "Idempotent-Replayed"
)

type middlewareSettings struct {
	methods    []string
	required   bool
	wait       time.Duration
	lease      time.Duration
	failOpen   bool
	headers    []string
	maxBody    int64
	onFailOpen func(r *http.Request, err error)
}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareSettings)

// WithMethods sets the methods the middleware applies to (default POST and PATCH).
func WithMethods(methods ...string) MiddlewareOption {
	return func(s *middlewareSettings) { s.methods = methods }
}

// RequireKey answers 400 to a request of those methods that has no Idempotency-Key.
// Without it such requests pass through unprotected.
func RequireKey() MiddlewareOption { return func(s *middlewareSettings) { s.required = true } }

// WithWait makes a duplicate that arrives while the first request runs wait up to d
// for its result, instead of getting 409 at once (at most 30 s).
func WithWait(d time.Duration) MiddlewareOption { return func(s *middlewareSettings) { s.wait = d } }

// WithLease sets the lease held while the handler runs, renewed every lease/3
// (default 30 s).
func WithLease(d time.Duration) MiddlewareOption { return func(s *middlewareSettings) { s.lease = d } }

// WithStoredHeaders sets the response headers stored and replayed (default
// Content-Type and Location). Set-Cookie is never stored.
func WithStoredHeaders(names ...string) MiddlewareOption {
	return func(s *middlewareSettings) { s.headers = names }
}

// WithMaxBody bounds the request body the middleware reads to fingerprint it
// (default 10 MiB); a larger one is refused with 413.
func WithMaxBody(n int64) MiddlewareOption { return func(s *middlewareSettings) { s.maxBody = n } }

// WithFailOpen lets requests through, unprotected, when idemd cannot be reached;
// report is called for each (it may be nil). The default is to answer 503.
func WithFailOpen(report func(r *http.Request, err error)) MiddlewareOption {
	return func(s *middlewareSettings) { s.failOpen, s.onFailOpen = true, report }
}

// Middleware makes handlers idempotent by the Idempotency-Key request header, as the
// IETF draft describes. For POST and PATCH (see WithMethods) carrying the header:
//
//   - the first request runs the handler; its status, stored headers and body are kept
//     and every later request with the key gets them back byte for byte, marked
//     Idempotent-Replayed: true;
//   - a duplicate that arrives while the first runs gets 409 with Retry-After (or
//     waits, WithWait);
//   - the key reused with a different request (method, path or body; JSON bodies are
//     compared after canonicalisation, so key order and spacing do not matter) gets
//     422;
//   - a 5xx answer or a panic frees the key, so that a retry runs the handler again;
//   - when idemd cannot be reached the answer is 503 (WithFailOpen to let requests
//     through instead).
//
// A response that cannot be stored (larger than the daemon's --max-response-bytes, or
// idemd unreachable when the handler finishes) is still sent to its client; its key
// stays held until the lease runs out, and a retry after that runs the handler again.
//
// Echo users wrap it: e.Use(echo.WrapMiddleware(idem.Middleware(client))).
func Middleware(c *Client, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	s := middlewareSettings{
		methods: []string{http.MethodPost, http.MethodPatch},
		lease:   30 * time.Second,
		headers: []string{"Content-Type", "Location"},
		maxBody: 10 << 20,
	}
	for _, o := range opts {
		o(&s)
	}
	stored := make([]string, 0, len(s.headers))
	for _, h := range s.headers {
		if h = http.CanonicalHeaderKey(h); h != "Set-Cookie" {
			stored = append(stored, h)
		}
	}
	s.headers = stored
	return func(next http.Handler) http.Handler {
		return &middleware{c: c, s: s, next: next}
	}
}

type middleware struct {
	c    *Client
	s    middlewareSettings
	next http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(m.s.methods, r.Method) {
		m.next.ServeHTTP(w, r)
		return
	}
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		if m.s.required {
			writeProblem(w, http.StatusBadRequest, "missing_idempotency_key", "Idempotency-Key is required", "this endpoint needs an Idempotency-Key header", 0)
			return
		}
		m.next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.s.maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeProblem(w, http.StatusRequestEntityTooLarge, "payload_too_large", "Request body too large",
				fmt.Sprintf("the body is over %d bytes", m.s.maxBody), 0)
			return
		}
		writeProblem(w, http.StatusBadRequest, "unreadable_body", "Unreadable request body", err.Error(), 0)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	cl, err := m.c.Claim(r.Context(), key, ClaimOptions{Fingerprint: Fingerprint(r, body), Lease: m.s.lease, Wait: m.s.wait})
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	switch cl.Outcome {
	case Completed, Failed:
		replay(w, cl.Response)
		return
	}

	rec := &recorder{ResponseWriter: w, header: m.s.headers}
	_, err = m.c.run(r.Context(), key, cl.Token, m.s.lease, func(ctx context.Context) (Response, error) {
		m.next.ServeHTTP(rec, r.WithContext(ctx))
		resp := rec.response()
		if resp.Status >= 500 {
			return resp, fmt.Errorf("handler answered %d", resp.Status)
		}
		return resp, nil
	})
	if err != nil && !rec.wrote {
		// The handler never answered (its lease was lost before it did).
		writeProblem(w, http.StatusConflict, "lease_lost", "Request taken over", err.Error(), 0)
	}
}

// refuse answers a claim that did not acquire.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var p *Problem
	switch {
	case errors.Is(err, ErrInProgress):
		retry := time.Second
		if errors.As(err, &p) && p.RetryAfter > 0 {
			retry = p.RetryAfter
		}
		writeProblem(w, http.StatusConflict, "in_progress", "Request in progress",
			"a request with this Idempotency-Key is being processed", retry)
	case errors.Is(err, ErrFingerprintMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, "fingerprint_mismatch", "Idempotency-Key reused",
			"this Idempotency-Key was used with a different request", 0)
	case errors.As(err, &p) && p.Status == http.StatusBadRequest:
		writeProblem(w, http.StatusBadRequest, "invalid_idempotency_key", "Invalid Idempotency-Key", p.Detail, 0)
	case m.s.failOpen:
		if m.s.onFailOpen != nil {
			m.s.onFailOpen(r, err)
		}
		m.next.ServeHTTP(w, r)
	default:
		writeProblem(w, http.StatusServiceUnavailable, "idempotency_unavailable", "Idempotency service unavailable",
			"the request was not run: its Idempotency-Key could not be checked", time.Second)
	}
}

func replay(w http.ResponseWriter, r *Response) {
	if r == nil {
		r = &Response{Status: http.StatusOK}
	}
	for k, vs := range r.Header {
		w.Header()[k] = slices.Clone(vs)
	}
	w.Header().Set(HeaderReplayed, "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(r.Body)))
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

func writeProblem(w http.ResponseWriter, status int, code, title, detail string, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code})
}

// recorder passes the handler's answer through and keeps a copy to store.
type recorder struct {
	http.ResponseWriter
	header []string
	status int
	body   bytes.Buffer
	kept   http.Header
	wrote  bool
}

func (rec *recorder) WriteHeader(status int) {
	if rec.wrote {
		return
	}
	rec.wrote, rec.status = true, status
	rec.kept = http.Header{}
	for _, k := range rec.header {
		if vs := rec.ResponseWriter.Header().Values(k); len(vs) > 0 {
			rec.kept[k] = slices.Clone(vs)
		}
	}
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *recorder) Write(b []byte) (int, error) {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	rec.body.Write(b)
	return rec.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

func (rec *recorder) response() Response {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	return Response{Status: rec.status, Header: rec.kept, Body: bytes.Clone(rec.body.Bytes())}
}
