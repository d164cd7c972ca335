package engine

import (
	"cmp"
	"context"
	"errors"
	"io"
	"sync"
	"time"
)

// Store keeps records and runs each transition atomically. Every method is one
// transition of one record; implementations translate their driver errors into the
// errors of this package (ErrUnavailable for anything that is not an answer about the
// record), except that a call whose context ended returns the context's error: the
// caller gave up, which says nothing about the store.
type Store interface {
	// Claim acquires the key, replays its result, or returns *InProgressError or
	// ErrFingerprintMismatch.
	Claim(ctx context.Context, c Claim) (ClaimResult, error)
	// Complete stores a result. Repeating the same completion succeeds again.
	Complete(ctx context.Context, c Completion) (Record, error)
	// Release frees the key for a retry or records a terminal failure. Repeating the same
	// release succeeds again.
	Release(ctx context.Context, r Release) (Record, error)
	// Extend renews the lease and returns the record as it left it.
	Extend(ctx context.Context, e Extension) (Record, error)
	// Mark records a recovery point and returns the record as it left it.
	Mark(ctx context.Context, m Mark) (Record, error)
	// Lookup returns the record, or ErrNotFound.
	Lookup(ctx context.Context, id ID) (Record, error)
	// Abandoned lists a page of abandoned keys in an order of the store's choosing that
	// a cursor continues; a key's lease may have been renewed or taken over since, so
	// the caller's claim decides. A malformed cursor is ErrBadCursor. Its cost grows with
	// the pending keys it reads, never with all the records.
	Abandoned(ctx context.Context, q AbandonedQuery) (AbandonedPage, error)
	// Purge deletes the record, or returns ErrNotFound.
	Purge(ctx context.Context, id ID) error
	// Watch reports changes to a record, made through any daemon sharing the store, from
	// the moment Watch returns; for a record that did not exist then, from the moment a
	// claim with Waiting set has seen it held.
	Watch(ctx context.Context, id ID) (Watch, error)
	// Ping reports whether the store can take writes.
	Ping(ctx context.Context) error
	Close() error
}

// Watch delivers a signal after a watched record changes. Signals may be merged; a
// receiver re-reads the record.
type Watch interface {
	C() <-chan struct{}
	Close()
}

// Service runs the transitions on a Store: it picks lease tokens and retention, and
// turns a claim with a wait into a sequence of claims paced by change notifications.
type Service struct {
	store     Store
	retention time.Duration
	// recheck bounds how long a waiter trusts notifications alone; it covers a
	// notification lost while the store's notification channel reconnects.
	recheck time.Duration
	// storeTimeout bounds each store call.
	storeTimeout time.Duration
	// stopWaiting is closed by StopWaiting: waiting claims answer at once.
	stopWaiting chan struct{}
	stopOnce    sync.Once
	// usage is what tenants with a quota keep, as last read from the store.
	usage usageCache
	// guard holds the largest tenants back when the store is nearly full.
	guard storeGuard
	// blobs keeps large results, nil without a blob store (blobsvc.go).
	blobs *blobs
}

// An Option changes a Service's default.
type Option func(*Service)

// DefaultStoreTimeout bounds each store call when WithStoreTimeout does not say. It is
// well under the SDK's 10 s request timeout, so that a client hears 503 from the
// daemon rather than timing out on its own and learning nothing.
const DefaultStoreTimeout = 2 * time.Second

// WithStoreTimeout bounds every store call (each round of a waiting claim is one
// call): past it the call fails with a *StoreTimeoutError, which is ErrUnavailable.
func WithStoreTimeout(d time.Duration) Option {
	return func(s *Service) {
		if d > 0 {
			s.storeTimeout = d
		}
	}
}

// Recheck sets how long a waiting claim trusts notifications alone before it claims
// again; one second by default. A lost notification delays a waiter by at most this.
func Recheck(d time.Duration) Option {
	return func(s *Service) { s.recheck = d }
}

// NewService returns a Service over store. retention is how long a pending record is
// kept when its holder never comes back, and the default retention of results.
func NewService(store Store, retention time.Duration, opts ...Option) *Service {
	if retention <= 0 {
		retention = DefaultRetention
	}
	s := &Service{store: store, retention: retention, recheck: time.Second, storeTimeout: DefaultStoreTimeout,
		stopWaiting: make(chan struct{}), usage: usageCache{refresh: DefaultUsageRefresh}}
	for _, opt := range opts {
		opt(s)
	}
	return s
}

// bounded runs one store call under the store deadline. An error caused by the
// caller's own context ending is returned as that context's error, never as the
// store's: a client hanging up says nothing about the store. The store's deadline
// passing is a *StoreTimeoutError.
func bounded[T any](s *Service, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	return boundedFor(s.storeTimeout, ctx, call)
}

// boundedFor is bounded under another deadline than the store's: a blob's calls get
// more time for more bytes.
func boundedFor[T any](timeout time.Duration, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := call(callCtx)
	if err == nil || !(errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return v, err
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return v, ctxErr
	}
	// The caller is still there, so a deadline or cancellation in the store's error is
	// the store's: its call deadline, or one a store set itself, such as a pipeline that
	// runs to the latest deadline of the calls it carries, which may pass an instant
	// before callCtx says so.
	if callCtx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return v, &StoreTimeoutError{Timeout: timeout, cause: err}
	}
	return v, err
}

// Claim claims a key, waiting up to r.Wait for a live holder to finish.
func (s *Service) Claim(ctx context.Context, r ClaimRequest) (ClaimResult, error) {
	if r.Lease == 0 {
		r.Lease = DefaultLease
	}
	retention, err := s.retentionFor(r.ID, r.Retention, r.Caps)
	if err != nil {
		return ClaimResult{}, err
	}
	c := Claim{
		ID:          r.ID,
		Fingerprint: r.Fingerprint,
		Owner:       r.Owner,
		Secret:      HashSecret(r.Secret),
		Lease:       r.Lease,
		Retention:   retention,
		Token:       NewLeaseToken(),
	}
	held, err := s.admit(ctx, r, c)
	if err != nil {
		return ClaimResult{}, err
	}
	// The reservation is held until the claim answers, through every round of a wait.
	var acquired bool
	var answered time.Time
	defer func() { s.settle(held, acquired, answered) }()
	claim := func(ctx context.Context) (ClaimResult, error) {
		res, err := s.store.Claim(ctx, c)
		answered = time.Now()
		if err == nil && res.Outcome == OutcomeAcquired {
			s.wrote(claimBytes(c))
		}
		if err == nil && res.Outcome == OutcomeAcquired && r.Caps.HasQuota() {
			if held != nil {
				acquired = true
			} else {
				s.acquired(r.ID, c)
			}
		}
		return res, err
	}
	if r.Wait <= 0 {
		res, err := bounded(s, ctx, claim)
		return s.replay(ctx, res, err)
	}

	c.Waiting = true
	deadline := time.Now().Add(r.Wait)
	// Watch before the first claim, so that a change between that claim's answer and
	// the wait below is not missed.
	w, err := bounded(s, ctx, func(ctx context.Context) (Watch, error) { return s.store.Watch(ctx, r.ID) })
	if err != nil {
		return ClaimResult{}, err
	}
	defer w.Close()
	// Since Go 1.23 Reset discards a pending expiry, so the timer is reused unstopped.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// The same token is used for every round: a round either acquires and returns,
		// or leaves the token unused.
		res, err := bounded(s, ctx, claim)
		var busy *InProgressError
		if !errors.As(err, &busy) {
			return s.replay(ctx, res, err)
		}
		remaining := time.Until(deadline)
		if remaining <= 0 || s.stopped() {
			busy.RetryAfter = max(busy.RetryAfter, 0)
			return res, err
		}
		pause := min(busy.RetryAfter, remaining, s.recheck)
		if pause < time.Millisecond {
			// The lease is about to run out; give its expiry a moment to pass.
			pause = time.Millisecond
		}
		timer.Reset(pause)
		select {
		case <-w.C():
		case <-timer.C:
		case <-ctx.Done():
			return res, err
		case <-s.stopWaiting:
			// Answered as if the wait had run out, so that a shutdown's drain does not
			// wait for it; the client retries elsewhere after Retry-After.
			busy.RetryAfter = max(busy.RetryAfter, 0)
			return res, err
		}
	}
}

// retentionFor is the one place where retention is decided: what the request asked
// for (zero when it did not say) or the service's default, within the tenant's cap.
func (s *Service) retentionFor(id ID, asked time.Duration, caps Caps) (time.Duration, error) {
	limit := caps.MaxRetention
	switch {
	case limit <= 0:
		return cmp.Or(asked, s.retention), nil
	case asked == 0:
		return min(s.retention, limit), nil
	case asked > limit:
		return 0, &CapError{Tenant: id.Tenant, Field: "retention_ms", Value: asked.Milliseconds(), Limit: limit.Milliseconds()}
	}
	return asked, nil
}

// checkSize holds a stored response to the tenant's cap, which can only lower the
// daemon-wide limit the HTTP layer checked while decoding.
func checkSize(id ID, r *Response, streamed int64, caps Caps) error {
	if n := int64(r.Size()) + streamed; caps.MaxResponseBytes > 0 && n > int64(caps.MaxResponseBytes) {
		return &CapError{Tenant: id.Tenant, Field: "response", Value: int64(n), Limit: int64(caps.MaxResponseBytes)}
	}
	return nil
}

// StopWaiting ends every claim's wait, now and from now on: each answers in progress
// at once, as if its wait_ms had run out. A daemon calls it when it begins to shut
// down, so that waiters do not hold the drain up to MaxWait.
func (s *Service) StopWaiting() { s.stopOnce.Do(func() { close(s.stopWaiting) }) }

func (s *Service) stopped() bool {
	select {
	case <-s.stopWaiting:
		return true
	default:
		return false
	}
}

// Complete stores the result of a held key. A result that would take a tenant with a
// byte quota past its allowance is stored as NotStoredResponse: the work
// ran, so the key is finished all the same, and its replay says the answer is gone.
func (s *Service) Complete(ctx context.Context, c Completion) (Record, error) {
	var err error
	if c.Retention, err = s.retentionFor(c.ID, c.Retention, c.Caps); err != nil {
		return Record{}, err
	}
	body, bodySize := c.Body, c.BodySize
	c.Body, c.BodySize = nil, 0
	if body == nil {
		bodySize = 0
	} else if bodySize < 0 || len(c.Response.Body) > 0 {
		return Record{}, errors.New("a completion's body is streamed with its size, or held in its response, not both")
	}
	if err := checkSize(c.ID, &c.Response, bodySize, c.Caps); err != nil {
		return Record{}, err
	}
	if body != nil && !s.blobs.largeSize(c.Response.Size(), bodySize) {
		// A body that stays in the record is read whole: it is no larger than the
		// threshold, itself within the stored response's limit.
		c.Response.Body = make([]byte, bodySize)
		if _, err := io.ReadFull(body, c.Response.Body); err != nil {
			return Record{}, err
		}
		body, bodySize = nil, 0
	}
	return s.storeResult(ctx, c.ID, c.LeaseToken, c.Caps, c.Retention, &c.Response, body, bodySize,
		func(ctx context.Context) (Record, error) { return s.store.Complete(ctx, c) })
}

// Release gives a held key back. A failure's response is held to the tenant's
// allowance as a completion's is.
func (s *Service) Release(ctx context.Context, r Release) (Record, error) {
	var err error
	if r.Retention, err = s.retentionFor(r.ID, r.Retention, r.Caps); err != nil {
		return Record{}, err
	}
	if err := checkSize(r.ID, r.Response, 0, r.Caps); err != nil {
		return Record{}, err
	}
	if r.Response != nil && r.Mode == ReleaseFail {
		failure := *r.Response
		r.Response = &failure
		return s.storeResult(ctx, r.ID, r.LeaseToken, r.Caps, r.Retention, r.Response, nil, 0,
			func(ctx context.Context) (Record, error) { return s.store.Release(ctx, r) })
	}
	rec, err := bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Release(ctx, r) })
	if err == nil && r.Response != nil {
		s.wrote(writeEstimate(r.Response.Size()))
	}
	return rec, err
}

// storeResult runs write, the transition that stores resp under the lease of id: held
// to the tenant's byte allowance (past it, resp becomes NotStoredResponse, since the
// work ran and the key is finished all the same), kept in the blob store by reference
// when large, and counted for the quota and the store guard once it answers. body,
// when set, is resp's body streamed (bodySize bytes), which must then be large.
func (s *Service) storeResult(ctx context.Context, id ID, token string, caps Caps, retention time.Duration,
	resp *Response, body io.Reader, bodySize int64, write func(context.Context) (Record, error)) (Record, error) {
	held, over := s.reserveWrite(ctx, id.Tenant, caps, resp.Size()+int(bodySize), retention)
	if over != nil {
		*resp = NotStoredResponse()
		body, bodySize = nil, 0
		held = s.hold(id.Tenant, resp.Size(), retention)
	}
	var blob string
	if s.blobs.large(resp) || body != nil {
		kept, name, err := s.offload(ctx, id, token, resp, body, bodySize, retention)
		if err != nil {
			s.settle(held, false, time.Now())
			return Record{}, err
		}
		*resp, blob = *kept, name
	}
	rec, err := bounded(s, ctx, write)
	if err == nil {
		s.wrote(writeEstimate(resp.Size()))
	}
	s.settleBlob(id, blob, err)
	s.settle(held, err == nil, time.Now())
	return rec, err
}

// Extend renews a held lease.
func (s *Service) Extend(ctx context.Context, e Extension) (Record, error) {
	return bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Extend(ctx, e) })
}

// Mark records a recovery point under a held lease. A point whose data would take a
// tenant with a byte quota past its allowance is refused with a
// *QuotaError: the holder goes on under its lease, and its result is stored as any is.
func (s *Service) Mark(ctx context.Context, m Mark) (Record, error) {
	held, over := s.reserveWrite(ctx, m.ID.Tenant, m.Caps, len(m.Name)+len(m.Data), s.retention)
	if over != nil {
		return Record{}, over
	}
	rec, err := bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Mark(ctx, m) })
	if err == nil {
		s.wrote(writeEstimate(len(m.Name) + len(m.Data)))
	}
	s.settle(held, err == nil, time.Now())
	return rec, err
}

// Abandoned lists a page of a tenant's abandoned keys.
func (s *Service) Abandoned(ctx context.Context, q AbandonedQuery) (AbandonedPage, error) {
	if q.Limit <= 0 || q.Limit > MaxAbandonedLimit {
		q.Limit = DefaultAbandonedLimit
	}
	return bounded(s, ctx, func(ctx context.Context) (AbandonedPage, error) { return s.store.Abandoned(ctx, q) })
}

// Lookup returns a record, its result read back from the blob store if it is kept
// there (or ErrResultUnavailable).
func (s *Service) Lookup(ctx context.Context, id ID) (Record, error) {
	rec, err := bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Lookup(ctx, id) })
	if err == nil {
		if err := s.resolve(ctx, &rec); err != nil {
			return Record{}, err
		}
	}
	return rec, err
}

// Inspect returns a record as the store keeps it: a result kept in the blob store is
// not read back, and the response keeps its reference under BlobHeader (Response.Blob
// reads it). It is for views that show a record without its result's bytes, such as
// the console's; Lookup is for answering the result.
func (s *Service) Inspect(ctx context.Context, id ID) (Record, error) {
	return bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Lookup(ctx, id) })
}

// replay reads back from the blob store the result a claim replays, if it is kept
// there.
func (s *Service) replay(ctx context.Context, res ClaimResult, err error) (ClaimResult, error) {
	if err != nil || res.Record.Response == nil {
		return res, err
	}
	if err := s.resolve(ctx, &res.Record); err != nil {
		return ClaimResult{}, err
	}
	return res, nil
}

// Purge deletes a record, and the blob of its result if it has one.
func (s *Service) Purge(ctx context.Context, id ID) error {
	var blob string
	if s.blobs != nil {
		rec, err := bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Lookup(ctx, id) })
		if err != nil {
			return err
		}
		if ref, ok := rec.Response.Blob(); ok {
			blob = ref.Name
		}
	}
	_, err := bounded(s, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, s.store.Purge(ctx, id) })
	if err == nil && blob != "" {
		_, err = bounded(s, ctx, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, s.blobs.store.Delete(ctx, blob)
		})
		if err != nil {
			// The record is gone; its blob is the sweep's now.
			s.blobs.onError("delete")
			err = nil
		}
	}
	return err
}

// Ready reports whether the store can take writes.
func (s *Service) Ready(ctx context.Context) error {
	_, err := bounded(s, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, s.store.Ping(ctx) })
	return err
}

// ErrNoPorter says that the store cannot move its records.
var ErrNoPorter = errors.New("the store cannot export or import records")

// Export calls fn for every live record of the store (see Porter.Export), with the
// results kept in the blob store read back, checked and put inline. It runs as long
// as it takes: the store deadline bounds each call, not the walk.
func (s *Service) Export(ctx context.Context, fn func(Exported) error) error {
	p, ok := s.store.(Porter)
	if !ok {
		return ErrNoPorter
	}
	return p.Export(ctx, func(e Exported) error {
		if err := s.exportResult(ctx, &e); err != nil {
			return err
		}
		return fn(e)
	})
}

// Import writes a record of a stream where the store holds none of its key (see
// Porter.Import), within caps' quota of the record's tenant: a record that would take
// it past max_records or max_stored_bytes is refused with a *QuotaError. With a blob
// store, a result over the threshold is written there first and the record keeps its
// reference, as a completion's would.
func (s *Service) Import(ctx context.Context, e Exported, caps Caps) (ImportOutcome, error) {
	p, ok := s.store.(Porter)
	if !ok {
		return "", ErrNoPorter
	}
	var held *reservation
	if caps.HasQuota() && e.ExpiresAt.After(time.Now()) {
		// The key counts twice on the embedded store (the record and its expiry).
		size := int64(2*len(e.ID.Key)+len(e.Fingerprint)+len(e.Owner)) + acquisitionEstimate
		if e.Response != nil {
			size += writeEstimate(e.Response.Size())
		}
		if e.RecoveryPoint != nil {
			size += writeEstimate(len(e.RecoveryPoint.Name) + len(e.RecoveryPoint.Data))
		}
		need := Usage{Records: 1, Bytes: size}
		var over *QuotaError
		if held, over = s.reserve(ctx, e.ID.Tenant, caps, need, need, time.Until(e.ExpiresAt)); over != nil {
			return "", over
		}
	}
	blob, err := s.importResult(ctx, &e)
	if err != nil {
		s.settle(held, false, time.Now())
		return "", err
	}
	outcome, err := bounded(s, ctx, func(ctx context.Context) (ImportOutcome, error) { return p.Import(ctx, e) })
	switch {
	case blob == "":
	case err != nil:
		s.settleBlob(e.ID, blob, err)
	case outcome != ImportWritten:
		// The store kept a record of its own (or the one an earlier import wrote).
		s.dropBlob(blob)
	}
	if err == nil && outcome == ImportWritten {
		size := writeEstimate(len(e.ID.Key)) + acquisitionEstimate
		if e.Response != nil {
			size += writeEstimate(e.Response.Size())
		}
		s.wrote(size)
	}
	s.settle(held, err == nil && outcome == ImportWritten, time.Now())
	return outcome, err
}

// ErrNoBackup says that the store keeps no file of its own to copy: Redis's own
// persistence and replicas are its backup.
var ErrNoBackup = errors.New("the store keeps no file of its own to back up")

// Backup writes a consistent copy of the store's database to w while it serves, and
// calls size with its length first; stores without a file of their own answer
// ErrNoBackup.
func (s *Service) Backup(ctx context.Context, w io.Writer, size func(int64)) (int64, error) {
	b, ok := s.store.(interface {
		Backup(ctx context.Context, w io.Writer, size func(int64)) (int64, error)
	})
	if !ok {
		return 0, ErrNoBackup
	}
	return b.Backup(ctx, w, size)
}
