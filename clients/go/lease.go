package idem

import "context"

// Lease is the lease that the code run by Do, Once or Middleware runs under. Attempt
// and Recovered let that code make its effects happen once, not only start once:
// see docs/effects.md.
type Lease struct {
	// Key is the idemd key the lease is on: Do's and Once's key, or for Middleware the
	// key it derived from the request's scope and Idempotency-Key (MiddlewareKey).
	Key string
	// Attempt grows by one at every acquisition of the key, so it is a fencing token: a
	// store that keeps the highest attempt it has seen for the key can refuse the writes
	// of a holder whose lease ran out and was taken over.
	Attempt int64
	// Recovered is true when this lease took the key over from a holder whose lease ran
	// out: that holder may have done part of the work, or all of it without storing
	// the result, so look the effect up before doing it again.
	Recovered bool
}

type leaseKey struct{}

// LeaseFrom returns the lease that the code given ctx runs under: the context Do and
// Once hand their function, or the request's context in a handler behind Middleware.
// It reports false where nothing holds a lease: a request that Middleware passed
// through (a method it does not guard, no Idempotency-Key) or ran unprotected because
// idemd could not be reached (WithFailOpen). The context itself tells whether the lease
// is still live: it is cancelled, with a cause that matches ErrLeaseLost, once the lease
// is lost.
func LeaseFrom(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(Lease)
	return l, ok
}

func withLease(ctx context.Context, l Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

func leaseOf(key string, cl *Claim) Lease {
	return Lease{Key: key, Attempt: cl.Attempt, Recovered: cl.Recovered}
}
