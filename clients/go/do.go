package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
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
	// Lease is the lease to claim and to renew every Lease/3 while the function runs.
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
// released and the panic goes on. If the lease is lost while fn runs (another caller
// took the key over after a renewal failed), fn's context is cancelled and Do returns
// ErrLeaseLost.
//
// Another caller holding the key is ErrInProgress (wait with DoOptions.Wait); a key
// used with another fingerprint is ErrFingerprintMismatch.
func (c *Client) Do(ctx context.Context, key, fingerprint string, fn func(ctx context.Context) (Response, error), opts ...DoOptions) (Result, error) {
	var o DoOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	cl, err := c.Claim(ctx, key, ClaimOptions{Fingerprint: fingerprint, Lease: o.lease(), Wait: o.Wait})
	if err != nil {
		return Result{}, err
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
	return c.run(ctx, leaseOf(key, cl), cl.Token, o.lease(), fn)
}

// Result is what Do returns: the response, and whether it was replayed from an
// earlier run instead of made now.
type Result struct {
	Response
	Replayed bool
}

// run runs fn under the lease and finishes the key according to how fn ended.
func (c *Client) run(ctx context.Context, held Lease, token string, lease time.Duration, fn func(ctx context.Context) (Response, error)) (res Result, err error) {
	key := held.Key
	fnCtx, cancel := context.WithCancelCause(withLease(ctx, held))
	defer cancel(nil)
	// Renewals go on until fn returns, even after ctx ends: fn may still be finishing
	// work it cannot stop, and a lease that runs out meanwhile lets another caller run
	// it again.
	stop := c.keepAlive(context.WithoutCancel(ctx), cancel, key, token, lease)

	finished := false
	defer func() {
		stop()
		if finished {
			return
		}
		// fn panicked: free the key, then let the panic go on.
		rctx, rcancel := c.callContext(context.WithoutCancel(ctx), 0)
		defer rcancel()
		_ = c.Release(rctx, key, token, Retry, nil)
	}()
	r, fnErr := fn(fnCtx)
	finished = true
	stop()
	if cause := context.Cause(fnCtx); errors.Is(cause, ErrLeaseLost) {
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

// keepAlive renews the lease every lease/3 until stop is called. When the daemon says
// the lease is lost it cancels the function's context with ErrLeaseLost; transport
// failures are tried again at the next tick. Renewals run on a timer rather than a
// goroutine of their own, which most calls, finished well before the first renewal,
// would start and stop for nothing. stop returns once no renewal is under way, so
// that what it decided is known.
func (c *Client) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, key, token string, lease time.Duration) (stop func()) {
	every := max(lease/3, 10*time.Millisecond)
	k := &keeper{}
	// Held until the timer is set, which the first renewal reads.
	k.mu.Lock()
	defer k.mu.Unlock()
	k.timer = time.AfterFunc(every, func() {
		k.mu.Lock()
		if k.stopped || ctx.Err() != nil {
			k.mu.Unlock()
			return
		}
		k.renewing.Add(1)
		k.mu.Unlock()
		defer k.renewing.Done()
		if _, err := c.Extend(ctx, key, token, lease); errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) {
			cancel(fmt.Errorf("%w: %q was taken over while the operation ran", ErrLeaseLost, key))
			return
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		if !k.stopped {
			k.timer.Reset(every)
		}
	})
	return k.stop
}

// keeper is the state of one keepAlive.
type keeper struct {
	timer    *time.Timer
	mu       sync.Mutex
	stopped  bool
	renewing sync.WaitGroup
}

func (k *keeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	k.timer.Stop()
	k.renewing.Wait()
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
