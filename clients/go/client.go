// Package idem is the Go client of idemd, the idempotency service: typed calls for
// claim, complete, release, extend, recovery points, lookup, purge and the
// abandoned-keys feed; Do, which runs a function at most once per key; Once and
// Consume, for queue consumers; Middleware, which makes an HTTP handler idempotent by
// its Idempotency-Key header; and Completer, which finishes the work of holders that
// died, from the recovery points they recorded. WithSealing seals the results and
// recovery points the client stores with keys idemd never sees.
//
// The package depends on the standard library and the generated idemapi client only.
package idem

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// Client talks to one idemd. It is safe for concurrent use.
type Client struct {
	api       *idemapi.Client
	owner     string
	token     string
	timeout   time.Duration
	retention time.Duration
	replays   *replayCache
	// batches gathers concurrent calls (WithBatching); nil sends each on its own.
	batches *batcher
	// tenant and ring seal what the client stores (WithSealing); ring is nil without.
	tenant string
	ring   *KeyRing
}

type settings struct {
	http      *http.Client
	owner     string
	token     string
	timeout   time.Duration
	retries   int
	backoff   time.Duration
	retention time.Duration
	batching  bool

	replayBytes int
	replayAge   time.Duration

	sealing    bool
	sealTenant string
	sealRing   *KeyRing
}

// Option configures a Client.
type Option func(*settings)

// WithHTTPClient sends requests through c instead of a default client.
func WithHTTPClient(c *http.Client) Option { return func(s *settings) { s.http = c } }

// WithTimeout bounds each call, retries included. A claim that waits (Wait) gets its
// wait on top. The default is 10 s; zero leaves calls unbounded.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithOwner names this client's process in the owner label of its claims (for
// example a host name and PID), which lookups show to operators. The label grants
// nothing: each claim carries a secret of its own, so two calls never share a lease.
// The default is random.
func WithOwner(owner string) Option { return func(s *settings) { s.owner = owner } }

// WithToken sends an API token as Authorization: Bearer, for a daemon that runs with
// an auth file.
func WithToken(token string) Option { return func(s *settings) { s.token = token } }

// WithRetries sets how many times a call is resent after a transport failure (a
// connection refused or reset, a timeout before any answer); the default is 3. Every
// call is safe to resend: a resent claim carries the same claim secret and gets the
// same lease, a resent complete or release is answered like the first.
func WithRetries(n int) Option { return func(s *settings) { s.retries = n } }

// WithRetention sets how long completed and failed results are kept; zero leaves it
// to the daemon (24 hours unless configured otherwise).
func WithRetention(d time.Duration) Option { return func(s *settings) { s.retention = d } }

// New returns a client of the idemd at baseURL, e.g. http://idemd.internal:8080.
func New(baseURL string, opts ...Option) (*Client, error) {
	s := settings{http: &http.Client{Transport: newTransport()}, timeout: 10 * time.Second, retries: 3, backoff: 50 * time.Millisecond,
		batching: true, replayBytes: DefaultReplayCacheBytes, replayAge: DefaultReplayCacheMaxAge}
	for _, o := range opts {
		o(&s)
	}
	if s.owner == "" {
		s.owner = "go-" + randomHex(8)
	}
	if err := checkSealing(&s); err != nil {
		return nil, err
	}
	doer := &retryDoer{client: s.http, retries: s.retries, backoff: s.backoff}
	api, err := idemapi.NewClient(baseURL, idemapi.WithHTTPClient(doer))
	if err != nil {
		return nil, err
	}
	c := &Client{api: api, owner: s.owner, token: s.token, timeout: s.timeout, retention: s.retention,
		replays: newReplayCache(s.replayBytes, s.replayAge), tenant: s.sealTenant, ring: s.sealRing}
	if s.batching {
		c.batches = &batcher{c: c}
	}
	return c, nil
}

func randomHex(n int) string {
	var b [32]byte
	_, _ = rand.Read(b[:n]) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b[:n])
}

// Response is an operation's result as idemd stores and replays it.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Outcome is what a claim produced.
type Outcome string

// The claim outcomes. A key held by someone else is an error, ErrInProgress.
const (
	Acquired  Outcome = "acquired"
	Completed Outcome = "completed"
	Failed    Outcome = "failed"
)

// ClaimOptions tune a claim; the zero value claims with the daemon's default lease and
// answers at once when the key is held.
type ClaimOptions struct {
	// Fingerprint is a digest of the payload; a key reused with another one is refused
	// with ErrFingerprintMismatch.
	Fingerprint string
	// Lease is how long the lease lasts before another caller may take the key over.
	Lease time.Duration
	// Wait is how long to wait for a holder to finish instead of failing with
	// ErrInProgress (at most 30 s).
	Wait time.Duration
	// Owner replaces the claim's owner label, shown by lookups; it grants nothing.
	Owner string
	// Secret replaces the claim's own secret (see NewSecret). A claim carrying the live
	// lease's secret gets that lease back, so keep it private to the one execution that
	// made it: never derive it from a job ID, which every redelivery shares.
	Secret string
}

// NewSecret returns a fresh claim secret: 128 random bits, hex-encoded.
func NewSecret() string { return randomHex(16) }

// Claim is a claim's answer.
type Claim struct {
	Outcome Outcome
	// Token proves the lease; it is set when Outcome is Acquired.
	Token   string
	Attempt int64
	// LeaseExpiresAt is when the lease runs out unless extended (Acquired only).
	LeaseExpiresAt time.Time
	// ExpiresAt is when idemd forgets the record; a finished key is replayed until then.
	ExpiresAt time.Time
	// Recovered is true when the lease was taken over from a holder whose lease ran out.
	Recovered bool
	// RecoveryPoint is the last point a holder of the key recorded (RecordRecoveryPoint),
	// handed on to this lease (Acquired only); nil when none was recorded.
	RecoveryPoint *RecoveryPoint
	// Response is the stored result when Outcome is Completed or Failed.
	Response *Response
}

// Record is what idemd keeps for a key.
type Record struct {
	Key            string
	State          string
	Attempt        int64
	Fingerprint    string
	Owner          string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	LeaseExpiresAt time.Time
	ExpiresAt      time.Time
	// RecoveryPoint is the last point a holder recorded, while the key is pending or
	// released for a retry; nil when none was recorded.
	RecoveryPoint *RecoveryPoint
	Response      *Response
}

// ReleaseMode says what a release does with the key.
type ReleaseMode string

// The release modes.
const (
	// Retry frees the key: the next claim acquires it with the next attempt.
	Retry ReleaseMode = "retry"
	// Fail stores a terminal failure that later claims replay.
	Fail ReleaseMode = "fail"
)

func (c *Client) callContext(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if c.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout+extra)
}

func (c *Client) authorize(_ context.Context, req *http.Request) error {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return nil
}

func ptr[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// Claim asks for the lease on key. It returns ErrInProgress (a *Problem with the
// RetryAfter) when another caller holds a live lease, and ErrFingerprintMismatch when
// the key was used with another fingerprint.
//
// When the stored response it replays, or the recovery point the lease starts from,
// does not open (see WithSealing), Claim returns the claim without it, and an error
// matching ErrUnsealable. A claim that acquired then holds the lease: release it, or
// let it run out.
func (c *Client) Claim(ctx context.Context, key string, opts ClaimOptions) (*Claim, error) {
	return c.claim(ctx, key, opts, false)
}

// claim is Claim. shared lets a claim answered from the replay cache share the
// cache's response, for a caller that only reads it.
func (c *Client) claim(ctx context.Context, key string, opts ClaimOptions, shared bool) (*Claim, error) {
	if cl, ok := c.replays.get(key, opts.Fingerprint, time.Now(), shared); ok {
		return cl, nil
	}
	gen := c.replays.generation()
	ctx, cancel := c.callContext(ctx, opts.Wait)
	defer cancel()
	owner := cmp.Or(opts.Owner, c.owner)
	// The secret is made once per call, so every resend of this claim carries it.
	secret := cmp.Or(opts.Secret, NewSecret())
	body := idemapi.ClaimRequest{Key: key, Fingerprint: ptr(opts.Fingerprint), Owner: &owner, ClaimSecret: &secret,
		LeaseMs: ptr(opts.Lease.Milliseconds()), WaitMs: ptr(opts.Wait.Milliseconds())}
	res := c.do(ctx, idemapi.BatchItem{Claim: &body})
	if res.err != nil {
		return nil, res.err
	}
	if res.status == http.StatusCreated {
		out := res.acquired
		if out == nil || out.LeaseToken == "" {
			// Not idemd's answer (a wrong base URL): nothing may run on it.
			return nil, errors.New("idem: the claim was answered 201 without a lease token; is the base URL idemd's?")
		}
		cl := &Claim{Outcome: Acquired, Token: out.LeaseToken, Attempt: out.Attempt, LeaseExpiresAt: out.LeaseExpiresAt,
			ExpiresAt: out.ExpiresAt, Recovered: out.Recovered}
		var err error
		cl.RecoveryPoint, err = c.openPoint(key, out.RecoveryPoint)
		return cl, err
	}
	out := res.finished
	if res.status != http.StatusOK || out == nil || !out.Outcome.Valid() {
		// Not idemd's answer (a wrong base URL): callers would take it for a lease.
		return nil, fmt.Errorf("idem: the claim was answered %d without a lease or a stored outcome; is the base URL idemd's?", res.status)
	}
	cl := &Claim{Outcome: Outcome(out.Outcome), Attempt: out.Attempt, ExpiresAt: out.ExpiresAt}
	var err error
	if cl.Response, err = c.openResponse(key, string(cl.Outcome), out.Response); err != nil {
		// Nothing goes to the replay cache: every claim asks idemd again, and fails as
		// this one did until the ring holds the key.
		return cl, err
	}
	// The claim matched the stored fingerprint exactly, so it is the record's.
	c.replays.put(key, opts.Fingerprint, cl.Outcome, cl.Attempt, cl.ExpiresAt, cl.Response, time.Now(), gen)
	return cl, nil
}

// Complete stores the result of the operation the lease was for. Repeating it is safe.
// It returns ErrLeaseLost when the lease was taken over.
func (c *Client) Complete(ctx context.Context, key, token string, r Response) error {
	_, err := c.complete(ctx, key, token, r)
	return err
}

func (c *Client) complete(ctx context.Context, key, token string, r Response) (*finishedRecord, error) {
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	stored, err := c.storedResponse(key, Completed, &r)
	if err != nil {
		return nil, err
	}
	if storedBytes(stored) > rawResultBytes {
		rec, err := c.putResult(ctx, key, token, stored)
		if err != nil {
			return nil, &rawUploadError{err: err}
		}
		return rec, nil
	}
	body := idemapi.CompleteRequest{Key: key, LeaseToken: token, Response: *stored,
		RetentionMs: ptr(c.retention.Milliseconds())}
	return recordOf(c.do(ctx, idemapi.BatchItem{Complete: &body}))
}

// rawResultBytes is the largest body (or sealed envelope) a completion sends base64 in
// JSON; a larger one goes as the raw body of PUT /v1/keys/{key}/result, which spares
// idemd and the client a third more bytes and a copy. A daemon with a blob store takes
// such a result up to its --max-blob-bytes; one without answers 413 over
// --max-response-bytes, either way.
const rawResultBytes = 1 << 20

// rawUploadError is the error of a completion sent as the raw upload, so that the
// middleware tells a large result that got no answer (R10a) by what was sent, the body
// or its sealed envelope, as the client chose.
type rawUploadError struct{ err error }

func (e *rawUploadError) Error() string { return e.err.Error() }
func (e *rawUploadError) Unwrap() error { return e.err }

func storedBytes(s *idemapi.StoredResponse) int {
	switch {
	case s.Sealed != nil:
		return len(*s.Sealed)
	case s.Body != nil:
		return len(*s.Body)
	}
	return 0
}

// putResult completes key with s as raw bytes: the same transition as complete.
func (c *Client) putResult(ctx context.Context, key, token string, s *idemapi.StoredResponse) (*finishedRecord, error) {
	params := &idemapi.PutResultParams{IdemdLeaseToken: token, IdemdStatus: s.Status,
		IdemdRetentionMs: ptr(c.retention.Milliseconds())}
	var body []byte
	switch {
	case s.Sealed != nil:
		body = *s.Sealed
		params.IdemdSealed = ptr(idemapi.N1)
	default:
		if s.Body != nil {
			body = *s.Body
		}
		if s.Headers != nil && len(*s.Headers) > 0 {
			h, err := json.Marshal(*s.Headers)
			if err != nil {
				return nil, fmt.Errorf("idem: the headers of the result of %q: %w", key, err)
			}
			params.IdemdResultHeaders = ptr(string(h))
		}
	}
	// A *bytes.Reader lets a request whose answer never came be sent again.
	resp, err := c.api.PutResultWithBody(ctx, key, params, "application/octet-stream", bytes.NewReader(body), c.authorize)
	if err != nil {
		return nil, transportError(err)
	}
	var out finishedRecord
	if err := decode(resp, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// recordOf is the record a complete or release answered.
func recordOf(res result) (*finishedRecord, error) {
	if res.err != nil {
		return nil, res.err
	}
	if res.status != http.StatusOK || res.record == nil {
		return nil, fmt.Errorf("idem: answered %d without the record; is the base URL idemd's?", res.status)
	}
	return res.record, nil
}

// Release gives the lease back: Retry frees the key, Fail stores r (which may be nil)
// as a terminal failure. A sealing client stores a nil r sealed too (see WithSealing).
func (c *Client) Release(ctx context.Context, key, token string, mode ReleaseMode, r *Response) error {
	_, err := c.release(ctx, key, token, mode, r)
	return err
}

func (c *Client) release(ctx context.Context, key, token string, mode ReleaseMode, r *Response) (*finishedRecord, error) {
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	body := idemapi.ReleaseRequest{Key: key, LeaseToken: token, Mode: idemapi.ReleaseRequestMode(mode),
		RetentionMs: ptr(c.retention.Milliseconds())}
	if mode == Fail || r != nil {
		stored, err := c.storedResponse(key, Failed, r)
		if err != nil {
			return nil, err
		}
		body.Response = stored
	}
	return recordOf(c.do(ctx, idemapi.BatchItem{Release: &body}))
}

// Extend renews the lease for another lease and returns when it now runs out.
func (c *Client) Extend(ctx context.Context, key, token string, lease time.Duration) (time.Time, error) {
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	body := idemapi.ExtendRequest{Key: key, LeaseToken: token, LeaseMs: lease.Milliseconds()}
	res := c.do(ctx, idemapi.BatchItem{Extend: &body})
	if res.err != nil {
		return time.Time{}, res.err
	}
	if res.status != http.StatusOK || res.extended == nil {
		return time.Time{}, fmt.Errorf("idem: the extend was answered %d without the lease; is the base URL idemd's?", res.status)
	}
	return res.extended.LeaseExpiresAt, nil
}

// Lookup returns the record of key, or ErrNotFound. When its response or recovery point
// does not open (see WithSealing), it returns the record without it, and an error
// matching ErrUnsealable.
func (c *Client) Lookup(ctx context.Context, key string) (*Record, error) {
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	resp, err := c.api.Lookup(ctx, key, c.authorize)
	if err != nil {
		return nil, transportError(err)
	}
	var out idemapi.KeyRecord
	if err := decode(resp, &out, http.StatusOK); err != nil {
		return nil, err
	}
	rec := &Record{Key: out.Key, State: string(out.State), Attempt: out.Attempt, CreatedAt: out.CreatedAt,
		UpdatedAt: out.UpdatedAt, ExpiresAt: out.ExpiresAt}
	if out.Fingerprint != nil {
		rec.Fingerprint = *out.Fingerprint
	}
	if out.Owner != nil {
		rec.Owner = *out.Owner
	}
	if out.LeaseExpiresAt != nil {
		rec.LeaseExpiresAt = *out.LeaseExpiresAt
	}
	var pointErr, responseErr error
	rec.RecoveryPoint, pointErr = c.openPoint(key, out.RecoveryPoint)
	rec.Response, responseErr = c.openResponse(key, rec.State, out.Response)
	return rec, cmp.Or(responseErr, pointErr)
}

// Purge deletes the record of key (it needs the admin scope), or returns ErrNotFound.
func (c *Client) Purge(ctx context.Context, key string) error {
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	// Forgotten before the call, so that even a purge that fails in transit leaves no
	// stale replay here.
	c.replays.remove(key)
	resp, err := c.api.Purge(ctx, key, c.authorize)
	if err != nil {
		return transportError(err)
	}
	if err := decode(resp, nil, http.StatusNoContent, http.StatusOK); err != nil {
		return err
	}
	// And after it, in case a claim answered in the meantime put the record back.
	c.replays.remove(key)
	return nil
}

func toStored(r Response) idemapi.StoredResponse {
	s := idemapi.StoredResponse{Status: r.Status}
	if len(r.Header) > 0 {
		h := map[string][]string(r.Header)
		s.Headers = &h
	}
	if len(r.Body) > 0 {
		s.Body = &r.Body
	}
	return s
}

func fromStored(s *idemapi.StoredResponse) *Response {
	if s == nil {
		return nil
	}
	r := &Response{Status: s.Status, Header: http.Header{}}
	if s.Headers != nil {
		r.Header = http.Header(*s.Headers)
	}
	if s.Body != nil {
		r.Body = *s.Body
	}
	return r
}

// answerBuffers hold answers while they are decoded. encoding/json copies whatever it
// keeps, so a buffer is free again once decode returns; a batch's answer, sent
// chunked, would otherwise be read into a slice grown again and again.
var answerBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledAnswer is the largest buffer kept for the next answer; one large answer
// (a lookup of a large stored response) does not stay in memory.
const maxPooledAnswer = 256 << 10

// maxAnswerBytes bounds an answer read: room for a claim or lookup that carries a
// result of DefaultMaxStoredBytes (idemd's default --max-blob-bytes) in base64.
const maxAnswerBytes = DefaultMaxStoredBytes*4/3 + 8<<20

// decode reads an answer: a JSON body into out when the status is one of want, a
// *Problem otherwise.
func decode(resp *http.Response, out any, want ...int) error {
	defer resp.Body.Close()
	buf := answerBuffers.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			buf.Reset()
			answerBuffers.Put(buf)
		}
	}()
	if resp.ContentLength > 0 {
		buf.Grow(int(min(resp.ContentLength, maxAnswerBytes)))
	}
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxAnswerBytes)); err != nil {
		return transportError(err)
	}
	body := buf.Bytes()
	for _, w := range want {
		if resp.StatusCode != w {
			continue
		}
		if out == nil || len(body) == 0 {
			return nil
		}
		if err := unmarshal(body, out); err != nil {
			return fmt.Errorf("idem: answer %d is not the expected JSON: %w", resp.StatusCode, err)
		}
		return nil
	}
	return problemFrom(resp, body)
}

// unmarshal is json.Unmarshal, by decodeBatchResults for a batch's answer.
func unmarshal(body []byte, out any) error {
	if results, ok := out.(*batchResults); ok {
		return decodeBatchResults(body, results)
	}
	return json.Unmarshal(body, out)
}

func problemFrom(resp *http.Response, body []byte) *Problem {
	p := &Problem{Status: resp.StatusCode}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var wire idemapi.Problem
	if (mt == "application/problem+json" || mt == "application/json") && json.Unmarshal(body, &wire) == nil {
		p.Type, p.Title, p.Code = wire.Type, wire.Title, string(wire.Code)
		if wire.Detail != nil {
			p.Detail = *wire.Detail
		}
		if wire.RetryAfterMs != nil {
			p.RetryAfter = msDuration(*wire.RetryAfterMs)
		}
	} else {
		// Not idemd's answer: a proxy or load balancer in between.
		p.Title = http.StatusText(resp.StatusCode)
		p.Detail = string(bytes.TrimSpace(body[:min(len(body), 200)]))
	}
	if p.RetryAfter == 0 {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			p.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return p
}

// Errors to branch on with errors.Is. A *Problem matches the one its code names.
var (
	ErrInProgress          = errors.New("idem: another caller holds the key")
	ErrFingerprintMismatch = errors.New("idem: the key was used with a different payload")
	ErrLeaseLost           = errors.New("idem: the lease is no longer held")
	ErrNotFound            = errors.New("idem: no record for the key")
	// ErrPayloadTooLarge is a request over one of idemd's size limits (a result over
	// --max-response-bytes, a recovery point's data over --max-recovery-point-bytes):
	// sending it again cannot succeed.
	ErrPayloadTooLarge = errors.New("idem: over idemd's size limit")
	// ErrUnavailable is a failure of idemd, its store, or the network to it. The call
	// may or may not have taken effect; resending it is safe. A key whose record is
	// being moved to another store (503 store_moved) is not one: it is a *Problem with
	// the wait in RetryAfter, the key is not free, and a middleware never fails open
	// on it.
	ErrUnavailable = errors.New("idem: idemd is unavailable")
	// ErrQuotaExceeded is a claim refused because the tenant keeps its quota of idemd's
	// store, or more than its share of a store that is nearly full: keys already
	// stored still replay, and new ones are taken again once records expire
	// (Problem.RetryAfter, when idemd knows).
	ErrQuotaExceeded = errors.New("idem: the tenant is at its quota of stored keys")
	// ErrLeaseExpired is why a lease was lost when its local deadline passed with no
	// renewal answered (see Lease.Deadline): idemd could not be reached, so it may have
	// let another caller take the key over. It matches ErrLeaseLost too; match it
	// first to tell the holder's own reckoning from idemd's answer.
	ErrLeaseExpired error = leaseExpired{}
)

// leaseExpired is ErrLeaseExpired's type, which also matches ErrLeaseLost: a lease
// that ran out is lost, whoever noticed first.
type leaseExpired struct{}

func (leaseExpired) Error() string {
	return "idem: the lease ran out before idemd answered a renewal"
}

func (leaseExpired) Is(target error) bool { return target == ErrLeaseLost }

// Problem is an RFC 9457 problem answered by idemd (or, with no Code, an error page
// from something in front of it).
type Problem struct {
	Type   string
	Title  string
	Status int
	Detail string
	// Code is idemd's machine-readable code, e.g. in_progress or lease_lost.
	Code string
	// RetryAfter is when trying again makes sense, for in_progress and unavailable.
	RetryAfter time.Duration
}

func (p *Problem) Error() string {
	msg := fmt.Sprintf("idemd: %d %s", p.Status, p.Title)
	if p.Code != "" {
		msg += " (" + p.Code + ")"
	}
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	return msg
}

// Is maps the problem's code to the package's errors.
func (p *Problem) Is(target error) bool {
	switch target {
	case ErrInProgress:
		return p.Code == "in_progress"
	case ErrFingerprintMismatch:
		return p.Code == "fingerprint_mismatch"
	case ErrLeaseLost:
		return p.Code == "lease_lost"
	case ErrNotFound:
		return p.Code == "not_found"
	case ErrPayloadTooLarge:
		return p.Code == "payload_too_large" || (p.Code == "" && p.Status == http.StatusRequestEntityTooLarge)
	case ErrQuotaExceeded:
		return p.Code == "quota_exceeded"
	case ErrUnavailable:
		return p.Code == "store_unavailable" || p.Code == "not_replicated" ||
			(p.Code == "" && (p.Status == http.StatusBadGateway || p.Status == http.StatusServiceUnavailable || p.Status == http.StatusGatewayTimeout))
	}
	return false
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// transportError marks a failure to get any answer as ErrUnavailable.
func transportError(err error) error {
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// retryDoer resends a request whose answer never came. Every idemd call is safe to
// resend (see WithRetries).
type retryDoer struct {
	client  *http.Client
	retries int
	backoff time.Duration
}

func (d *retryDoer) Do(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		resp, err := d.client.Do(req)
		if err == nil || attempt >= d.retries || req.Context().Err() != nil {
			return resp, err
		}
		if req.Body != nil {
			if req.GetBody == nil {
				return nil, err
			}
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			req.Body = body
		}
		select {
		case <-time.After(d.backoff << attempt):
		case <-req.Context().Done():
			return nil, err
		}
	}
}
