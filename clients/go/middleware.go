package idem

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The headers of the Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header).
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed marks an answer replayed from the stored first one. It is Stripe's
	// convention; the draft defines no replay marker.
	HeaderReplayed = "Idempotent-Replayed"
)

// IncidentKind names a case where the middleware could not keep its promise, or could
// not protect a request. The values are stable and meant for metric labels.
type IncidentKind string

// The incident kinds, as docs/middleware.md lists them.
const (
	// IncidentUnavailable: idemd could not be reached; the request got 503.
	IncidentUnavailable IncidentKind = "unavailable"
	// IncidentFailOpen: idemd could not be reached; the handler ran unprotected.
	IncidentFailOpen IncidentKind = "fail_open"
	// IncidentIdemdRefused: idemd answered an error (401, 403, 429, …); the request
	// got 503 and the handler did not run.
	IncidentIdemdRefused IncidentKind = "idemd_refused"
	// IncidentQuotaExceeded: idemd refused a new key because the service's tenant is at
	// its quota of stored keys (or over its share of a nearly full store); the request
	// got 503 and the handler did not run.
	IncidentQuotaExceeded IncidentKind = "quota_exceeded"
	// IncidentScopeMissing: the scope function gave nothing; the request got 500.
	IncidentScopeMissing IncidentKind = "scope_missing"
	// IncidentResultNotStored: the handler ran but its answer could not be stored (too
	// large, a hijacked connection, a protocol switch, a panic after its status); a
	// response_not_stored failure was stored instead.
	IncidentResultNotStored IncidentKind = "result_not_stored"
	// IncidentCompleteFailed: the handler ran but storing its result failed; once the
	// lease runs out a retry runs the handler again.
	IncidentCompleteFailed IncidentKind = "complete_failed"
	// IncidentReleaseFailed: the key could not be freed after a failure; retries get
	// 409 until the lease runs out.
	IncidentReleaseFailed IncidentKind = "release_failed"
	// IncidentLeaseLost: idemd answered that the lease was lost while the handler ran,
	// so another request may have run the same operation.
	IncidentLeaseLost IncidentKind = "lease_lost"
	// IncidentLeaseExpired: the lease's local deadline passed while the handler ran,
	// with no renewal answered (idemd could not be reached), so another request may
	// have run the same operation.
	IncidentLeaseExpired IncidentKind = "lease_expired"
	// IncidentReplayInvalid: a stored answer could not be replayed.
	IncidentReplayInvalid IncidentKind = "replay_invalid"
	// IncidentReplayUnsealable: a stored answer does not open (see WithSealing): it is
	// sealed with a key the client's ring does not hold, or changed in the store, or
	// plain under a ring that requires sealing. The request got 502 and the handler did
	// not run; Incident.Err is the *SealError.
	IncidentReplayUnsealable IncidentKind = "replay_unsealable"
)

// Incident is what the incident hook receives.
type Incident struct {
	Kind IncidentKind
	// IdemdKey is the key in idemd (see MiddlewareKey and WithKeyPrefix), empty when
	// none was derived.
	IdemdKey string
	// Err is the cause, when there is one.
	Err error
}

type middlewareSettings struct {
	scope       func(*http.Request) string
	prefix      string
	methods     []string
	required    bool
	wait        time.Duration
	lease       time.Duration
	failOpen    bool
	headers     []string
	maxBody     int64
	maxStored   int
	storeStatus func(int) bool
	onFailOpen  func(r *http.Request, err error)
	onIncident  func(r *http.Request, inc Incident)
}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middlewareSettings)

// WithScope is required: it names whose request r is, usually the authenticated user
// or account ID from the authentication that runs before the middleware. Keys are
// kept per scope, so that one user never gets another's answer. A request for which
// it returns "" (or invalid UTF-8) is refused with 500. Only a service whose answers
// are not private may return a constant.
func WithScope(scope func(r *http.Request) string) MiddlewareOption {
	return func(s *middlewareSettings) { s.scope = scope }
}

// WithKeyPrefix puts prefix before every idemd key the middleware derives, so that
// the keys of one route or service share it: a Completer (or the abandoned-keys feed)
// selects them by it, for example "orders/". The idemd key of a request becomes prefix
// followed by MiddlewareKey(scope, key); the lease the handler finds with LeaseFrom,
// and incidents, carry that full key, and Lookup takes it. The derivation itself does
// not change. Middleware panics for a prefix that is not valid UTF-8 or over 172
// bytes, which would make keys over idemd's 255.
func WithKeyPrefix(prefix string) MiddlewareOption {
	return func(s *middlewareSettings) { s.prefix = prefix }
}

// WithMethods sets the methods the middleware applies to (default POST and PATCH).
func WithMethods(methods ...string) MiddlewareOption {
	return func(s *middlewareSettings) { s.methods = methods }
}

// RequireKey answers 400 to a request of those methods that has no Idempotency-Key.
// Without it such requests pass through unprotected.
func RequireKey() MiddlewareOption { return func(s *middlewareSettings) { s.required = true } }

// The contract's limits on a claim's wait and lease.
const (
	maxWait  = 30 * time.Second
	minLease = 100 * time.Millisecond
	maxLease = time.Hour
)

// WithWait makes a duplicate that arrives while the first request runs wait up to d
// for its result, instead of getting 409 at once (at most 30 s). A duplicate whose
// client leaves stops waiting at once.
func WithWait(d time.Duration) MiddlewareOption { return func(s *middlewareSettings) { s.wait = d } }

// WithLease sets the lease held while the handler runs, renewed every lease/3, and
// sooner after a renewal that failed (default 30 s; 100 ms to 1 h). Once 95 % of the
// lease has passed since the claim or the last renewal idemd answered was sent, the
// handler's context is cancelled as if the lease were lost (incident lease_expired).
func WithLease(d time.Duration) MiddlewareOption { return func(s *middlewareSettings) { s.lease = d } }

// WithStoredHeaders sets the response headers stored and replayed (default
// Content-Type and Location); names are compared without regard to case. Set-Cookie,
// hop-by-hop and framing headers are never stored: naming one panics.
func WithStoredHeaders(names ...string) MiddlewareOption {
	return func(s *middlewareSettings) { s.headers = names }
}

// WithMaxBody bounds the request body the middleware reads to fingerprint it
// (default 10 MiB); a larger one is refused with 413.
func WithMaxBody(n int64) MiddlewareOption { return func(s *middlewareSettings) { s.maxBody = n } }

// DefaultMaxStoredBytes is the largest result the middleware records by default:
// idemd's default --max-blob-bytes. Below it idemd's own limit decides: a daemon with
// a blob store keeps a result up to its --max-blob-bytes, one without up to its
// --max-response-bytes (1 MiB by default), and refuses a larger one with 413, which
// the middleware answers as it answers a result over this bound.
const DefaultMaxStoredBytes = 64 << 20

// WithMaxStoredBytes bounds the result stored, its body plus its stored header names
// and values (default DefaultMaxStoredBytes). A larger result still reaches its
// client; a retry gets 409 response_not_stored. The recorder holds at most this much
// of an answer in memory.
func WithMaxStoredBytes(n int) MiddlewareOption {
	return func(s *middlewareSettings) { s.maxStored = n }
}

// WithStoredStatuses decides which final statuses are results to store. The default
// stores 2xx, 3xx and 402, and frees the key after any other 4xx: such answers mean
// the operation did not run (Stripe keeps a result only once the endpoint started),
// so the client may fix its request, or wait, and retry with the same key. 5xx always
// frees the key. A handler that has side effects before answering a 4xx adds it here.
func WithStoredStatuses(store func(status int) bool) MiddlewareOption {
	return func(s *middlewareSettings) { s.storeStatus = store }
}

// WithFailOpen lets requests through, unprotected, while idemd cannot be reached (no
// answer, a proxy's 502/503/504, or idemd's store unavailable); report is called for
// each (it may be nil). An error answered by idemd (401, 403, 429, …) never lets a
// request through. The default is to answer 503.
func WithFailOpen(report func(r *http.Request, err error)) MiddlewareOption {
	return func(s *middlewareSettings) { s.failOpen, s.onFailOpen = true, report }
}

// WithIncidentHook calls hook, after the answer is written, for every case where the
// middleware could not keep its promise or could not protect a request: count them by
// Incident.Kind.
func WithIncidentHook(hook func(r *http.Request, inc Incident)) MiddlewareOption {
	return func(s *middlewareSettings) { s.onIncident = hook }
}

// neverStored are the response headers no stored answer carries: cookies belong to
// the first caller, hop-by-hop and framing headers to one connection, and the server
// writes Date and Content-Length itself.
var neverStored = []string{
	"set-cookie", "set-cookie2",
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
	"te", "trailer", "transfer-encoding", "upgrade",
	"content-length", "date", "idempotent-replayed",
}

func defaultStoreStatus(status int) bool {
	return (status >= 200 && status < 400) || status == http.StatusPaymentRequired
}

// Middleware makes handlers idempotent by the Idempotency-Key request header, as the
// IETF draft describes, and as docs/middleware.md specifies row by row for every
// language. For POST and PATCH (see WithMethods) carrying the header:
//
//   - the key is kept per scope (WithScope, required) in a namespace of its own (see
//     MiddlewareKey), so that users never share answers and no client can name the
//     keys the service's own code uses with Do and Once;
//   - the first request runs the handler; a result (2xx, 3xx, 402, see
//     WithStoredStatuses) is stored with its allow-listed headers, and every later
//     request with the key gets it back byte for byte, marked Idempotent-Replayed;
//   - a duplicate that arrives while the first runs gets 409 with Retry-After (or
//     waits, WithWait);
//   - the key reused with a different request (method, path, query, media type or
//     body; see Fingerprint) gets 422;
//   - any other 4xx, a 5xx, a panic before any status, or a client that went away
//     before the handler answered frees the key, so that a retry runs the handler
//     again; a panic after a status to store keeps a response_not_stored failure;
//   - when idemd cannot be reached the answer is 503 (WithFailOpen to let requests
//     through instead); when idemd answers an error, 503 and never fail-open;
//   - with a client made WithSealing, every answer stored is sealed, including the
//     response_not_stored failures; a stored answer that does not open is 502
//     stored_response_unsealable (incident replay_unsealable), and the handler does
//     not run.
//
// The handler finds the lease it runs under with LeaseFrom(r.Context()): its attempt
// and whether it recovered the key from a request whose lease ran out, for fencing its
// writes (docs/effects.md). A request that runs unprotected has none.
//
// Cases where the middleware cannot keep its promise reach WithIncidentHook.
//
// Middleware panics without WithScope, when WithStoredHeaders names a header that is
// never stored, or when WithKeyPrefix gives a prefix that keys cannot carry.
//
// Echo users wrap it, and render a handler's returned error inside it, because Echo
// writes returned errors only after every middleware has returned: the middleware
// would see a handler that wrote nothing, store an empty 200, and replay it for a
// request that failed.
//
//	e.Use(echo.WrapMiddleware(idem.Middleware(client, idem.WithScope(...))))
//	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
//		return func(c echo.Context) error {
//			if err := next(c); err != nil {
//				c.Error(err)
//			}
//			return nil
//		}
//	})
func Middleware(c *Client, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	s := middlewareSettings{
		methods:     []string{http.MethodPost, http.MethodPatch},
		lease:       30 * time.Second,
		headers:     []string{"Content-Type", "Location"},
		maxBody:     10 << 20,
		maxStored:   DefaultMaxStoredBytes,
		storeStatus: defaultStoreStatus,
	}
	for _, o := range opts {
		o(&s)
	}
	if s.scope == nil {
		panic("idem.Middleware: WithScope is required: keys must be kept per user or account, or one user gets another's answers")
	}
	// idemd refuses every claim outside its limits (api/openapi.yaml), so such a
	// middleware would answer 503 to every request.
	if s.wait < 0 || s.wait > maxWait {
		panic(fmt.Sprintf("idem.Middleware: WithWait(%s): idemd waits 0 to %s", s.wait, maxWait))
	}
	if s.lease < minLease || s.lease > maxLease {
		panic(fmt.Sprintf("idem.Middleware: WithLease(%s): idemd's leases last %s to %s", s.lease, minLease, maxLease))
	}
	// Every derived key has the same length, so a prefix that fits once fits always.
	if n := len(s.prefix) + middlewareKeyBytes; n > maxKeyBytes || !utf8.ValidString(s.prefix) {
		panic(fmt.Sprintf("idem.Middleware: WithKeyPrefix(%q): the prefix must be valid UTF-8 of at most %d bytes, so that keys stay within idemd's %d",
			s.prefix, maxKeyBytes-middlewareKeyBytes, maxKeyBytes))
	}
	stored := make([]string, 0, len(s.headers))
	for _, h := range s.headers {
		h = asciiLower(strings.TrimSpace(h))
		if slices.Contains(neverStored, h) {
			panic(fmt.Sprintf("idem.Middleware: WithStoredHeaders(%q): that header is never stored", h))
		}
		stored = append(stored, h)
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

func (m *middleware) incident(r *http.Request, kind IncidentKind, key string, err error) {
	if m.s.onIncident != nil {
		m.s.onIncident(r, Incident{Kind: kind, IdemdKey: key, Err: err})
	}
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(m.s.methods, r.Method) {
		m.next.ServeHTTP(w, r)
		return
	}
	key, err := parseKeyHeader(r.Header.Values(HeaderIdempotencyKey))
	switch {
	case errors.Is(err, errNoKey) && m.s.required:
		writeProblem(w, http.StatusBadRequest, "missing_idempotency_key", "Idempotency-Key is required", "this endpoint needs an Idempotency-Key header", 0)
		return
	case errors.Is(err, errNoKey):
		m.next.ServeHTTP(w, r)
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, "invalid_idempotency_key", "Invalid Idempotency-Key", err.Error(), 0)
		return
	}
	scope := m.s.scope(r)
	if scope == "" || !utf8.ValidString(scope) {
		writeProblem(w, http.StatusInternalServerError, "idempotency_scope_missing", "Request scope unknown",
			"the service could not tell whose request this is; it was not run", 0)
		m.incident(r, IncidentScopeMissing, "", nil)
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

	idemdKey := m.s.prefix + MiddlewareKey(scope, key)
	// A claim that does not wait is answered at once: it outlives a client that goes
	// away meanwhile, so that a lease it took is known and can be given back rather
	// than left to run out. A claim that waits may wait up to 30 s, so it ends with its
	// client (C3a), and so does idemd's waiter; a lease granted just as the client left
	// never reaches the middleware and runs out, which keeps at most once.
	// A replay from the client's cache shares the cache's copy: replay only reads it.
	claimCtx := context.WithoutCancel(r.Context())
	if m.s.wait > 0 {
		claimCtx = r.Context()
	}
	// The lease is reckoned from the claim's send, which is no later than idemd's start
	// of it.
	sent := time.Now()
	cl, err := m.c.claim(claimCtx, idemdKey,
		ClaimOptions{Fingerprint: Fingerprint(r, body), Lease: m.s.lease, Wait: m.s.wait}, true)
	if errors.Is(err, ErrUnsealable) {
		m.unsealable(w, r, idemdKey, cl, err)
		return
	}
	if err != nil {
		if claimCtx.Err() != nil {
			// The client left while the claim waited: nobody is there to answer, and
			// nothing ran.
			return
		}
		m.refuse(w, r, idemdKey, err)
		return
	}
	switch cl.Outcome {
	case Completed, Failed:
		m.replay(w, r, idemdKey, cl.Response)
		return
	}
	if r.Context().Err() != nil {
		// The client left while the claim waited: nothing ran.
		m.release(r, idemdKey, cl.Token)
		return
	}
	held, err := m.c.hold(r.Context(), idemdKey, cl, m.s.lease, sent)
	if err != nil {
		// The claim waited, and idemd answered the renewal made before the handler
		// starts that the lease is gone: nothing ran, and the key is another's.
		writeProblem(w, http.StatusConflict, "lease_lost", "Request taken over",
			"another request with this Idempotency-Key took over before this one ran", time.Second)
		m.incident(r, IncidentLeaseLost, idemdKey, err)
		return
	}
	m.run(w, r, held, cl.Token)
}

// refuse answers a claim that did not acquire.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, key string, err error) {
	retry := time.Second
	var p *Problem
	if errors.As(err, &p) && p.RetryAfter > 0 {
		retry = p.RetryAfter
	}
	switch {
	case errors.Is(err, ErrInProgress):
		writeProblem(w, http.StatusConflict, "in_progress", "Request in progress",
			"a request with this Idempotency-Key is being processed", retry)
	case errors.Is(err, ErrFingerprintMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, "fingerprint_mismatch", "Idempotency-Key reused",
			"this Idempotency-Key was used with a different request", 0)
	case errors.Is(err, ErrUnavailable) && m.s.failOpen:
		if m.s.onFailOpen != nil {
			m.s.onFailOpen(r, err)
		}
		m.next.ServeHTTP(w, r)
		m.incident(r, IncidentFailOpen, key, err)
	case errors.Is(err, ErrUnavailable):
		writeProblem(w, http.StatusServiceUnavailable, "idempotency_unavailable", "Idempotency service unavailable",
			"the request was not run: its Idempotency-Key could not be checked", retry)
		m.incident(r, IncidentUnavailable, key, err)
	case errors.Is(err, ErrQuotaExceeded):
		// An answer too, and one that protects every other tenant's keys: failing open
		// would defeat it.
		writeProblem(w, http.StatusServiceUnavailable, "idempotency_quota_exceeded", "Idempotency quota exceeded",
			"the request was not run: the service keeps as many Idempotency-Keys as idemd allows it until some expire", retry)
		m.incident(r, IncidentQuotaExceeded, key, err)
	default:
		// An answer, not an outage: it holds for every retry, so failing open on it
		// would run the operation again and again.
		writeProblem(w, http.StatusServiceUnavailable, "idempotency_unavailable", "Idempotency service unavailable",
			"the request was not run: its Idempotency-Key could not be checked", retry)
		m.incident(r, IncidentIdemdRefused, key, err)
	}
}

// unsealable answers a claim whose stored answer, or the recovery point its lease
// would start from, does not open (P5). The handler does not run: the key is done, or
// its work cannot resume from where it stopped. A lease taken is given back for a
// retry, which a service whose ring opens the point can take.
func (m *middleware) unsealable(w http.ResponseWriter, r *http.Request, key string, cl *Claim, err error) {
	if cl != nil && cl.Outcome == Acquired {
		m.release(r, key, cl.Token)
	}
	writeProblem(w, http.StatusBadGateway, "stored_response_unsealable", "Stored response cannot be opened",
		"what is stored for this Idempotency-Key is sealed with a key this service does not hold, or does not open; the request was not run", 0)
	m.incident(r, IncidentReplayUnsealable, key, err)
}

// run runs the handler under the lease, which the handler finds with LeaseFrom, and
// finishes the key according to its answer.
func (m *middleware) run(w http.ResponseWriter, r *http.Request, held Lease, token string) {
	key := held.Key
	rec := &recorder{ResponseWriter: w, allowed: m.s.headers, limit: m.s.maxStored}
	ctx, cancel := context.WithCancelCause(withLease(r.Context(), held))
	defer cancel(nil)
	// Renewals go on while the handler runs, even after its client has gone.
	stop := m.c.keepAlive(context.WithoutCancel(r.Context()), cancel, key, token, held.clock)
	finished := false
	defer func() {
		stop()
		if !finished {
			// The handler panicked; the panic goes on once the key is finished.
			m.cutShort(r, key, token, rec)
		}
	}()
	// A lease whose deadline passed before the handler could start (a claim that
	// waited, whose renewal got no answer) runs nothing.
	if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
		m.next.ServeHTTP(rec, r.WithContext(ctx))
	}
	finished = true
	stop()

	if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
		// The key may belong to another request now: nothing is stored, and it is not
		// released.
		kind, detail := IncidentLeaseLost, "another request with this Idempotency-Key took over while this one ran"
		if errors.Is(cause, ErrLeaseExpired) {
			kind, detail = IncidentLeaseExpired, "idemd could not be reached to keep this request's hold on its Idempotency-Key; another request may take over"
		}
		if !rec.wrote && !rec.hijacked {
			writeProblem(w, http.StatusConflict, "lease_lost", "Request taken over", detail, time.Second)
		}
		m.incident(r, kind, key, cause)
		return
	}
	if !rec.wrote && !rec.hijacked && r.Context().Err() == nil {
		// net/http answers 200 with no body for a handler that wrote nothing.
		rec.snapshot(http.StatusOK)
	}
	switch {
	case rec.hijacked || rec.status == http.StatusSwitchingProtocols:
		m.notStored(r, key, token, errors.New("the connection was taken over; there is no answer to store"))
	case !rec.wrote:
		// The client went away and the handler stopped without answering: nothing ran.
		m.release(r, key, token)
	case rec.status >= 500 || !m.s.storeStatus(rec.status):
		m.release(r, key, token)
	case rec.tooLarge:
		m.notStored(r, key, token, fmt.Errorf("the answer is over %d bytes", m.s.maxStored))
	default:
		m.complete(r, key, token, rec)
	}
}

// cutShort finishes the key of a handler that panicked. Before a final status nothing
// was answered and a retry may run it again. After a status to store, the work started
// and part of a success reached the client: running it again could do it twice, and
// the part written is no answer to replay.
func (m *middleware) cutShort(r *http.Request, key, token string, rec *recorder) {
	switch {
	case rec.hijacked || rec.status == http.StatusSwitchingProtocols:
		m.notStored(r, key, token, errors.New("the handler panicked after taking the connection over"))
	case rec.wrote && rec.status < 500 && m.s.storeStatus(rec.status):
		m.notStored(r, key, token, fmt.Errorf("the handler panicked after answering %d", rec.status))
	default:
		m.release(r, key, token)
	}
}

// finishContext is for the calls that finish a key: they must happen even when the
// client has gone. Each call bounds itself by the client's timeout.
func finishContext(r *http.Request) context.Context { return context.WithoutCancel(r.Context()) }

func (m *middleware) complete(r *http.Request, key, token string, rec *recorder) {
	// The recorder is done with: its copy of the answer goes to the replay cache as it is.
	err := m.c.completeOnce(finishContext(r), key, token, &Response{Status: rec.status, Header: rec.kept, Body: rec.body.Bytes()})
	var p *Problem
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		m.incident(r, IncidentLeaseLost, key, err)
	case errors.As(err, &p) && (p.Status == http.StatusRequestEntityTooLarge || p.Status == http.StatusBadRequest):
		// idemd will not keep this answer (over its size limit, or headers it refuses).
		m.notStored(r, key, token, err)
	case errors.Is(err, ErrUnavailable) && errors.As(err, new(*rawUploadError)):
		// A daemon without a blob store may answer 413 to a large body before reading it
		// and close the connection, which reaches the client as no answer at all. Left
		// claimed (R13), the key would run the handler again once its lease ran out.
		// Large is what the client sent raw: the body, or its sealed envelope.
		m.notStored(r, key, token, err)
	default:
		m.incident(r, IncidentCompleteFailed, key, err)
	}
}

// release frees the key for a retry.
func (m *middleware) release(r *http.Request, key, token string) {
	if err := m.c.Release(finishContext(r), key, token, Retry, nil); err != nil {
		m.incident(r, IncidentReleaseFailed, key, err)
	}
}

// notStored keeps at most once for an answer that cannot be replayed: it stores a
// failure telling later requests that the operation ran and its answer is gone.
func (m *middleware) notStored(r *http.Request, key, token string, cause error) {
	body, _ := json.Marshal(problemBody(http.StatusConflict, "response_not_stored", "Response not stored",
		"the request with this Idempotency-Key was processed, but its response could not be kept; do not send it again"))
	failure := &Response{Status: http.StatusConflict, Header: http.Header{"content-type": {"application/problem+json"}}, Body: body}
	if err := m.c.Release(finishContext(r), key, token, Fail, failure); err != nil {
		m.incident(r, IncidentReleaseFailed, key, err)
	}
	m.incident(r, IncidentResultNotStored, key, cause)
}

// replay writes a stored answer, without any header that is never stored, whatever
// wrote the record.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, key string, resp *Response) {
	if resp == nil || resp.Status < 200 || resp.Status > 599 {
		writeProblem(w, http.StatusBadGateway, "stored_response_invalid", "Stored response cannot be replayed",
			"the answer stored for this Idempotency-Key cannot be replayed", 0)
		status := 0
		if resp != nil {
			status = resp.Status
		}
		m.incident(r, IncidentReplayInvalid, key, fmt.Errorf("stored status %d", status))
		return
	}
	for name, values := range resp.Header {
		if slices.ContainsFunc(neverStored, func(n string) bool { return asciiEqualFold(n, name) }) {
			continue
		}
		for _, v := range values {
			w.Header().Add(name, v)
		}
	}
	w.Header().Set(HeaderReplayed, "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func problemBody(status int, code, title, detail string) map[string]any {
	return map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
}

func writeProblem(w http.ResponseWriter, status int, code, title, detail string, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problemBody(status, code, title, detail))
}

// recorder passes the handler's answer through, flushes and all, and keeps a copy of
// its final status, its allow-listed headers and as much of its body as may be stored.
type recorder struct {
	http.ResponseWriter
	allowed  []string
	limit    int
	status   int
	kept     http.Header
	body     bytes.Buffer
	size     int
	wrote    bool
	tooLarge bool
	hijacked bool
}

func (rec *recorder) WriteHeader(status int) {
	if rec.wrote || rec.hijacked {
		rec.ResponseWriter.WriteHeader(status) // net/http reports the superfluous call
		return
	}
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		// An informational answer (100, 103 Early Hints): the final one follows.
		rec.ResponseWriter.WriteHeader(status)
		return
	}
	rec.snapshot(status)
	rec.ResponseWriter.WriteHeader(status)
}

// snapshot records the final status and the stored headers as they are now.
func (rec *recorder) snapshot(status int) {
	rec.wrote, rec.status = true, status
	rec.kept = make(http.Header, len(rec.allowed))
	for name, values := range rec.ResponseWriter.Header() {
		// The allowed name in lower case, as it is stored; found without making one.
		i := slices.IndexFunc(rec.allowed, func(a string) bool { return asciiEqualFold(a, name) })
		if len(values) == 0 || i < 0 {
			continue
		}
		lower := rec.allowed[i]
		rec.kept[lower] = append(rec.kept[lower], values...)
		for _, v := range values {
			rec.size += len(lower) + len(v)
		}
	}
	rec.tooLarge = rec.size > rec.limit
}

func (rec *recorder) Write(b []byte) (int, error) {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	if !rec.tooLarge {
		if rec.size+len(rec.body.Bytes())+len(b) > rec.limit {
			rec.tooLarge = true
			rec.body = bytes.Buffer{}
		} else {
			rec.body.Write(b)
		}
	}
	return rec.ResponseWriter.Write(b)
}

// Flush makes the recorder an http.Flusher, so that streaming handlers still stream.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// FlushError is what http.ResponseController calls to flush.
func (rec *recorder) FlushError() error {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(rec.ResponseWriter).Flush()
}

// Hijack hands the connection over; the answer that follows cannot be stored.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, buf, err := http.NewResponseController(rec.ResponseWriter).Hijack()
	if err == nil {
		rec.hijacked = true
	}
	return conn, buf, err
}

// Unwrap lets http.ResponseController reach the real writer for everything else.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }
