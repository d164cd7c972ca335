package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lease is the lease that the code run by Do, Once, Consume, Middleware or a Completer
// runs under. Attempt and Recovered let that code make its effects happen once, not
// only start once: see docs/effects.md. RecoveryPoint and Checkpoint let it resume
// where an earlier holder stopped instead of starting over. Remaining and Deadline
// tell how long the lease is known to last, so that the code can bound what it calls
// by it.
//
// A Lease is a value; copies of it share the reckoning of its deadline, so compare
// leases by their fields rather than with ==.
type Lease struct {
	// Key is the idemd key the lease is on: Do's and Once's key, a Completer's listed
	// key, or for Middleware the key it derived from the request's scope and
	// Idempotency-Key (MiddlewareKey), after its WithKeyPrefix.
	Key string
	// Attempt grows by one at every acquisition of the key, so it is a fencing token: a
	// store that keeps the highest attempt it has seen for the key can refuse the writes
	// of a holder whose lease ran out and was taken over.
	Attempt int64
	// Recovered is true when this lease took the key over from a holder whose lease ran
	// out: that holder may have done part of the work, or all of it without storing
	// the result, so look the effect up before doing it again.
	Recovered bool
	// RecoveryPoint is the last point an earlier holder of the key recorded with
	// Checkpoint, which this lease starts from: it is handed on by a takeover
	// (Recovered) and by a claim after a release for a retry. It is nil when no holder
	// recorded one, and it is gone once the key is completed or failed.
	RecoveryPoint *RecoveryPoint

	clock *leaseClock
}

// Remaining is how long the lease is still known to be held: the time to its local
// deadline, which every answered renewal moves on. It is 0 once the lease is lost or
// its deadline has passed, and for a Lease that no call handed out.
func (l Lease) Remaining() time.Duration {
	if l.clock == nil {
		return 0
	}
	return l.clock.remaining(time.Now())
}

// Deadline is the lease's local deadline as it stands now: the send time of the claim,
// or of the last renewal idemd answered, plus 95 % of the lease. The 5 % are kept for
// the holder's clock and idemd's running at different rates. Renewals move it later,
// so bound a call by Remaining, or by Deadline read just before the call. It carries
// the monotonic clock reading of time.Now. It is the zero time for a Lease that no
// call handed out.
func (l Lease) Deadline() time.Time {
	if l.clock == nil {
		return time.Time{}
	}
	l.clock.mu.Lock()
	defer l.clock.mu.Unlock()
	return l.clock.deadline
}

// leaseClock is the holder's reckoning of one lease, shared by the copies of its Lease
// and by the keeper that renews it, with what Checkpoint needs to act under the lease.
type leaseClock struct {
	mu       sync.Mutex
	lease    time.Duration
	deadline time.Time
	// ended is set when the lease is lost: idemd said so, or its deadline passed with
	// no renewal answered. cause says which.
	ended bool
	cause error

	// c and token are the client that holds the lease and the lease's token, which a
	// recovery point is recorded under.
	c     *Client
	token string
	// keeper renews the lease while its work runs; a checkpoint that idemd answers
	// lease_lost ends the lease through it, so that the work's context is cancelled as
	// for a renewal answered so. nil before the work starts.
	keeper *keeper
}

// reckoned is the part of a lease the holder counts on. idemd starts the lease when it
// receives the claim or the renewal, after the holder sent it, so reckoning from the
// send covers the network; the 5 % left out cover the two clocks running at different
// rates, which NTP keeps within 500 ppm and an unsynchronised crystal within about
// 100 ppm, with room to spare for a virtual machine whose clock stalls.
func reckoned(lease time.Duration) time.Duration { return lease - lease/20 }

func newLeaseClock(c *Client, token string, lease time.Duration, sent time.Time) *leaseClock {
	return &leaseClock{c: c, token: token, lease: lease, deadline: sent.Add(reckoned(lease))}
}

func (lc *leaseClock) remaining(now time.Time) time.Duration {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.ended {
		return 0
	}
	return max(0, lc.deadline.Sub(now))
}

type leaseKey struct{}

// LeaseFrom returns the lease that the code given ctx runs under: the context Do and
// Once hand their function, or the request's context in a handler behind Middleware.
// It reports false where nothing holds a lease: a request that Middleware passed
// through (a method it does not guard, no Idempotency-Key) or ran unprotected because
// idemd could not be reached (WithFailOpen). The context itself tells whether the lease
// is still live: it is cancelled, with a cause that matches ErrLeaseLost, once the lease
// is lost, and one that also matches ErrLeaseExpired when its deadline passed with no
// renewal answered.
func LeaseFrom(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(Lease)
	return l, ok
}

func withLease(ctx context.Context, l Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

func leaseOf(key string, cl *Claim, clock *leaseClock) Lease {
	return Lease{Key: key, Attempt: cl.Attempt, Recovered: cl.Recovered, RecoveryPoint: cl.RecoveryPoint, clock: clock}
}

// Checkpoint records a recovery point under the lease: name says how far the work got
// (1 to 128 bytes of UTF-8, for example "charged") and data what the next holder needs
// to go on from there (at most the daemon's --max-recovery-point-bytes, 4096 by
// default; it may be nil). It replaces the point recorded before. Should this holder
// not finish the key, the next one finds the point in its Lease.RecoveryPoint: record
// one right after each effect that must not be made twice, with what identifies it.
//
// When idemd answers that the lease is lost (another caller took the key over, or it
// is gone), Checkpoint returns an error that matches ErrLeaseLost and ends the lease as
// a renewal answered so would: the work's context is cancelled with that cause, and
// the call that runs the work fails with it and stores nothing. Once the lease has
// ended, Checkpoint returns why without asking idemd. Data over the daemon's limit is
// a *Problem with status 413 that matches ErrPayloadTooLarge, and records nothing;
// the lease goes on. Other failures (ErrUnavailable) leave the lease as it is.
func (l Lease) Checkpoint(ctx context.Context, name string, data []byte) error {
	lc := l.clock
	if lc == nil || lc.c == nil {
		return errors.New("idem: Checkpoint needs a lease handed out by Do, Once, Consume, Middleware or a Completer")
	}
	if cause := lc.lost(); cause != nil {
		return cause
	}
	err := lc.c.RecordRecoveryPoint(ctx, l.Key, lc.token, name, data)
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) {
		return lc.end(fmt.Errorf("%w: %q was taken over, or is gone, before its recovery point %q was recorded: %w", ErrLeaseLost, l.Key, name, err))
	}
	return err
}

// lost is why the lease ended, or nil while it is held.
func (lc *leaseClock) lost() error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if !lc.ended {
		return nil
	}
	return lc.cause
}

// end ends the lease with cause, unless it has ended already, and returns why it
// ended.
func (lc *leaseClock) end(cause error) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.ended {
		return lc.cause
	}
	if lc.keeper != nil {
		lc.keeper.lose(cause)
	} else {
		lc.ended, lc.cause = true, cause
	}
	return cause
}
