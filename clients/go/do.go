package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ErrFailed reports a key whose operation failed for good: Do returns it with the
// stored failure when it replays one.
var ErrFailed = errors.New("idem: the operation failed permanently")

// PermanentError is an operation's failure that must not be retried. Do stores its
// Response as the key's terminal failure instead of releasing the key.
type PermanentError struct {
	Err      error
	Response Response
}

func (e *PermanentError) Error() string { return "permanent failure: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a failure to store and replay (for example a declined card):
// return it from the function given to Do.
func Permanent(err error, r Response) error { return &PermanentError{Err: err, Response: r} }

// DoOptions tune Do and Once; the zero value uses a 30 s lease, extended while the
// function runs, and answers at once with ErrInProgress when the key is held.
type DoOptions struct {
	// Lease is the lease to claim and to renew every Lease/3 while the function runs
	// (sooner after a renewal that failed).
	Lease time.Duration
	// Wait is how long to wait for another holder to finish.
	Wait time.Duration
}

func (o DoOptions) lease() time.Duration {
	if o.Lease <= 0 {
		return 30 * time.Second
	}
	return o.Lease
}

// Do runs fn at most once for key. It claims the key; when it gets the lease it runs
// fn, renewing the lease in the background every lease/3, and stores fn's response.
// fn finds the lease it runs under, with its attempt and whether it recovered the key
// from a holder whose lease ran out, with LeaseFrom(ctx).
// When the key is already done it returns the stored response with Replayed true,
// without running fn.
//
// If fn returns an error the key is released so that a later call runs fn again; if
// the error is a PermanentError, its response is stored as a terminal failure
// instead, and later calls get it back with ErrFailed. If fn panics the key is
// released and the panic goes on. If the lease is lost while fn runs (idemd answers a
// renewal that the key was taken over, or the lease's deadline passes with no renewal
// answered, see Lease.Deadline), fn's context is cancelled and Do returns an error that
// matches ErrLeaseLost (and ErrLeaseExpired in the second case), and fn's own error if
// it returned one; nothing is stored, and the key is not released. A result fn returns
// after its lease's deadline is never stored as a success.
//
// Another caller holding the key is ErrInProgress (wait with DoOptions.Wait); a key
// used with another fingerprint is ErrFingerprintMismatch.
//
// With WithSealing, a stored result that does not open is an error matching
// ErrUnsealable, with Replayed true: fn does not run, for the key is done. So is a
// recovery point the lease would start from that does not open; then the key is
// released for a retry, and fn does not run either.
func (c *Client) Do(ctx context.Context, key, fingerprint string, fn func(ctx context.Context) (Response, error), opts ...DoOptions) (Result, error) {
	var o DoOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	return c.claimAndRun(ctx, key, fingerprint, fn, o, releaseForRetry)
}

// onFailure is what run does with the key when the function fails, not for good.
type onFailure int

const (
	// releaseForRetry frees the key, so that the next call runs the function again:
	// Do's way, for a caller that retries.
	releaseForRetry onFailure = iota
	// leavePending gives nothing back: the key stays pending, and once the lease runs
	// out the abandoned-keys feed lists it again. A Completer's way, which a release
	// would take the key out of the feed it works from.
	leavePending
)

// claimAndRun is Do, with what a failure of fn does to the key.
func (c *Client) claimAndRun(ctx context.Context, key, fingerprint string, fn func(ctx context.Context) (Response, error), o DoOptions, failure onFailure) (Result, error) {
	// The lease is reckoned from the claim's send, which is no later than idemd's start
	// of it.
	sent := time.Now()
	cl, err := c.Claim(ctx, key, ClaimOptions{Fingerprint: fingerprint, Lease: o.lease(), Wait: o.Wait})
	switch {
	case err == nil:
	case cl == nil:
		return Result{}, err
	case cl.Outcome == Acquired:
		// The recovery point the lease starts from does not open: the work cannot
		// resume from it, and nothing runs. The key goes back for a holder whose ring
		// opens it, unless failures leave it pending.
		if failure == releaseForRetry {
			rctx, cancel := c.callContext(context.WithoutCancel(ctx), 0)
			defer cancel()
			_ = c.Release(rctx, key, cl.Token, Retry, nil)
		}
		return Result{}, err
	default:
		// The key is done, and its result does not open here: running the work
		// again would do it twice.
		return Result{Replayed: true}, err
	}
	var stored Response
	if cl.Response != nil {
		stored = *cl.Response
	}
	switch cl.Outcome {
	case Completed:
		return Result{Response: stored, Replayed: true}, nil
	case Failed:
		return Result{Response: stored, Replayed: true}, ErrFailed
	}
	held, err := c.hold(ctx, key, cl, o.lease(), sent)
	if err != nil {
		return Result{}, err
	}
	return c.run(ctx, held, cl.Token, fn, failure)
}

// hold starts the holder's reckoning of the lease that cl, a claim sent at sent,
// acquired. A claim answered more than lease/3 after its send (it waited for another
// holder) would start the work with its deadline near or already past, so the lease
// is renewed once first and reckoned from that renewal's send. A renewal that gets no
// answer leaves the claim's deadline; one answered lease_lost or not_found means that
// the lease is gone before anything ran, and hold returns an error that matches
// ErrLeaseLost.
func (c *Client) hold(ctx context.Context, key string, cl *Claim, lease time.Duration, sent time.Time) (Lease, error) {
	if time.Since(sent) > lease/3 {
		// An answer that comes later than the lease after its send is of no use.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reckoned(lease))
		defer cancel()
		renewed := time.Now()
		_, err := c.Extend(rctx, key, cl.Token, lease)
		switch {
		case err == nil:
			sent = renewed
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
			return Lease{}, fmt.Errorf("%w: %q was lost before the operation ran: %w", ErrLeaseLost, key, err)
		}
	}
	return leaseOf(key, cl, newLeaseClock(c, cl.Token, lease, sent)), nil
}

// Result is what Do returns: the response, and whether it was replayed from an
// earlier run instead of made now.
type Result struct {
	Response
	Replayed bool
}

// run runs fn under the lease and finishes the key according to how fn ended, and
// failure for a failure that is not for good.
func (c *Client) run(ctx context.Context, held Lease, token string, fn func(ctx context.Context) (Response, error), failure onFailure) (res Result, err error) {
	key := held.Key
	fnCtx, cancel := context.WithCancelCause(withLease(ctx, held))
	defer cancel(nil)
	// Renewals go on until fn returns, even after ctx ends: fn may still be finishing
	// work it cannot stop, and a lease that runs out meanwhile lets another caller run
	// it again.
	stop := c.keepAlive(context.WithoutCancel(ctx), cancel, key, token, held.clock)

	finished := false
	defer func() {
		stop()
		if finished || failure == leavePending {
			return
		}
		// fn panicked: free the key, then let the panic go on.
		rctx, rcancel := c.callContext(context.WithoutCancel(ctx), 0)
		defer rcancel()
		_ = c.Release(rctx, key, token, Retry, nil)
	}()
	var r Response
	var fnErr error
	// A lease whose deadline passed before fn could start (a claim that waited, whose
	// renewal got no answer) runs nothing.
	if !errors.Is(context.Cause(fnCtx), ErrLeaseLost) {
		r, fnErr = fn(fnCtx)
	}
	finished = true
	stop()
	if cause := context.Cause(fnCtx); errors.Is(cause, ErrLeaseLost) {
		if fnErr != nil {
			// fn's own error still says what happened to the work (a fence that refused
			// a stale write, for one), though nothing about it is stored.
			return Result{}, fmt.Errorf("%w (the operation returned: %w)", cause, fnErr)
		}
		return Result{}, cause
	}

	// Finish even if ctx ended while fn ran: the work is done and must be recorded.
	fctx, fcancel := c.callContext(context.WithoutCancel(ctx), 0)
	defer fcancel()
	gen := c.replays.generation()
	var perm *PermanentError
	switch {
	case errors.As(fnErr, &perm):
		rec, err := c.release(fctx, key, token, Fail, &perm.Response)
		if err != nil {
			return Result{}, fmt.Errorf("%w (and storing the failure: %w)", fnErr, err)
		}
		c.remember(key, rec, Failed, &perm.Response, gen)
		return Result{Response: perm.Response}, fnErr
	case fnErr != nil && failure == leavePending:
		return Result{}, fnErr
	case fnErr != nil:
		if err := c.Release(fctx, key, token, Retry, nil); err != nil {
			return Result{}, fmt.Errorf("%w (and releasing the key: %w)", fnErr, err)
		}
		return Result{}, fnErr
	}
	rec, err := c.complete(fctx, key, token, r)
	if err != nil {
		return Result{}, fmt.Errorf("idem: %q ran but its result was not stored: %w", key, err)
	}
	c.remember(key, rec, Completed, &r, gen)
	return Result{Response: r}, nil
}

// completeOnce is Complete for a lease this client took and finishes exactly once
// (Middleware's): the result it stores is r, so it goes to the replay cache too. r
// becomes the cache's: the caller must not change it afterwards.
func (c *Client) completeOnce(ctx context.Context, key, token string, r *Response) error {
	gen := c.replays.generation()
	rec, err := c.complete(ctx, key, token, *r)
	if err != nil {
		return err
	}
	if c.replays != nil && rec.State == string(Completed) {
		c.replays.keep(key, recordFingerprint(rec), Completed, rec.Attempt, rec.ExpiresAt, r, time.Now(), gen)
	}
	return nil
}

// remember puts a copy of a result this client just stored into the replay cache.
// Only the callers that finish a lease exactly once call it, so the stored result is
// r: a repeated completion with the same token keeps the first result, whatever it
// sends, which is why the public Complete does not remember. gen is the cache's
// generation taken before the call that stored it.
func (c *Client) remember(key string, rec *finishedRecord, outcome Outcome, r *Response, gen uint64) {
	if c.replays == nil || rec.State != string(outcome) {
		return
	}
	c.replays.put(key, recordFingerprint(rec), outcome, rec.Attempt, rec.ExpiresAt, r, time.Now(), gen)
}

func recordFingerprint(rec *finishedRecord) string {
	if rec.Fingerprint == nil {
		return ""
	}
	return *rec.Fingerprint
}

// keepAlive renews the lease every lease/3 until stop is called, and ends it at its
// local deadline (Lease.Deadline) unless a renewal was answered before. When idemd
// says the lease is lost it cancels the function's context with a cause matching
// ErrLeaseLost; when the deadline passes first, with one matching ErrLeaseExpired too.
// A renewal that fails without that answer is tried again sooner and sooner as the
// deadline nears (renewalRetry). Renewals and the deadline run on timers rather than a
// goroutine of their own, which most calls, finished well before the first renewal,
// would start and stop for nothing. stop returns once no renewal is under way, so that
// what it decided is known; it also ends a lease whose deadline passed before the
// timer's callback could run, so that a result returned after the deadline is never
// taken for one made under the lease.
func (c *Client) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, key, token string, clock *leaseClock) (stop func()) {
	k := &keeper{c: c, ctx: ctx, cancel: cancel, key: key, token: token, clock: clock,
		every: max(clock.lease/3, 10*time.Millisecond)}
	// Held until the timers are set, which their callbacks read.
	clock.mu.Lock()
	defer clock.mu.Unlock()
	clock.keeper = k
	now := time.Now()
	left := clock.deadline.Sub(now)
	if left <= 0 {
		k.expire()
		k.stopped = true
		return k.stop
	}
	k.expiry = time.AfterFunc(left, k.onDeadline)
	k.renewal = time.AfterFunc(max(0, clock.deadline.Add(k.every-reckoned(clock.lease)).Sub(now)), k.renew)
	return k.stop
}

// keeper is the state of one keepAlive. Its clock's mutex guards the fields below
// the clock.
type keeper struct {
	c          *Client
	ctx        context.Context
	cancel     context.CancelCauseFunc
	key, token string
	every      time.Duration
	clock      *leaseClock

	renewal  *time.Timer
	expiry   *time.Timer
	stopped  bool
	renewing sync.WaitGroup
	stopOnce sync.Once
}

// renew is the renewal timer's callback: one renewal, and the timer set for the next.
func (k *keeper) renew() {
	lc := k.clock
	lc.mu.Lock()
	if k.stopped || lc.ended {
		lc.mu.Unlock()
		return
	}
	k.renewing.Add(1)
	deadline := lc.deadline
	lc.mu.Unlock()
	defer k.renewing.Done()

	// An answer after the deadline comes too late to keep the lease, so the renewal
	// waits for none; the sent time is taken before any batch queue, which makes it no
	// later than the real send.
	ctx, cancel := context.WithDeadline(k.ctx, deadline)
	sent := time.Now()
	_, err := k.c.Extend(ctx, k.key, k.token, lc.lease)
	cancel()

	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.ended {
		// The deadline passed while the renewal was under way: its answer changes
		// nothing.
		return
	}
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) {
		k.lose(fmt.Errorf("%w: %q was taken over while the operation ran", ErrLeaseLost, k.key))
		return
	}
	now := time.Now()
	if !now.Before(lc.deadline) {
		k.expire()
		return
	}
	var next time.Duration
	if err == nil {
		lc.deadline = sent.Add(reckoned(lc.lease))
		next = max(0, sent.Add(k.every).Sub(now))
		if !k.stopped {
			k.expiry.Reset(lc.deadline.Sub(now))
		}
	} else {
		next = renewalRetry(lc.lease, lc.deadline.Sub(now))
	}
	if !k.stopped {
		k.renewal.Reset(next)
	}
}

// onDeadline is the deadline timer's callback. A renewal answered since the timer was
// set may have moved the deadline on; then the timer is set again.
func (k *keeper) onDeadline() {
	lc := k.clock
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if k.stopped || lc.ended {
		return
	}
	if left := lc.deadline.Sub(time.Now()); left > 0 {
		k.expiry.Reset(left)
		return
	}
	k.expire()
}

// expire ends the lease at its deadline. The caller holds the clock's mutex.
func (k *keeper) expire() {
	k.lose(fmt.Errorf("%w: another caller may take %q over", ErrLeaseExpired, k.key))
}

// lose ends the lease and cancels the function's context with cause. The caller holds
// the clock's mutex, so that stop finds the context cancelled whenever the lease is
// ended.
func (k *keeper) lose(cause error) {
	k.clock.ended, k.clock.cause = true, cause
	k.cancel(cause)
	if k.renewal != nil {
		k.renewal.Stop()
	}
}

func (k *keeper) stop() {
	k.stopOnce.Do(func() {
		lc := k.clock
		lc.mu.Lock()
		k.stopped = true
		lc.mu.Unlock()
		if k.renewal != nil {
			k.renewal.Stop()
			k.expiry.Stop()
		}
		k.renewing.Wait()
		lc.mu.Lock()
		defer lc.mu.Unlock()
		if !lc.ended && !time.Now().Before(lc.deadline) {
			k.expire()
		}
	})
}

// renewalRetry is how long to wait before trying again a renewal that failed without
// an answer about the lease: a delay drawn from [d/2, d], where d is a sixth of the
// lease, or a third of the time left to the deadline once that is shorter, and at
// least 10 ms. Tries come closer together as the deadline nears, so that a link back
// in time is found in time; the draw spreads the tries of many holders cut off at
// once.
func renewalRetry(lease, left time.Duration) time.Duration {
	d := max(10*time.Millisecond, min(lease/6, left/3))
	return d/2 + rand.N(d-d/2+1)
}

// Once runs fn at most once per message key, for consumers of brokers that deliver
// at least once: a redelivered message whose key already ran returns nil without
// running fn. An error from fn releases the key so that the next delivery runs fn
// again. Another consumer running the same key is ErrInProgress: leave the message
// for redelivery. fn finds its lease with LeaseFrom(ctx), as under Do.
func (c *Client) Once(ctx context.Context, key string, fn func(ctx context.Context) error, opts ...DoOptions) error {
	_, err := c.Do(ctx, key, "", func(ctx context.Context) (Response, error) {
		return Response{Status: 200}, fn(ctx)
	}, opts...)
	return err
}

// MessageKey derives a key from a message's stable fields (for example the topic,
// the partition and the producer's message ID; never the delivery count or the
// receive time). Each part is length-prefixed before hashing, so ("ab", "c") and
// ("a", "bc") give different keys.
func MessageKey(parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return "msg-" + hex.EncodeToString(h.Sum(nil))
}
