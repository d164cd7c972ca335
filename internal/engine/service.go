package engine

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// Store keeps records and runs each transition atomically. Every method is one
// transition of one record; implementations translate their driver errors into the
// errors of this package (ErrUnavailable for anything that is not an answer about the
// record).
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
	// Lookup returns the record, or ErrNotFound.
	Lookup(ctx context.Context, id ID) (Record, error)
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
}

// An Option changes a Service's default.
type Option func(*Service)

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
	s := &Service{store: store, retention: retention, recheck: time.Second}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Claim claims a key, waiting up to r.Wait for a live holder to finish.
func (s *Service) Claim(ctx context.Context, r ClaimRequest) (ClaimResult, error) {
	if r.Lease == 0 {
		r.Lease = DefaultLease
	}
	c := Claim{
		ID:          r.ID,
		Fingerprint: r.Fingerprint,
		Owner:       r.Owner,
		Secret:      HashSecret(r.Secret),
		Lease:       r.Lease,
		Retention:   cmp.Or(r.Retention, s.retention),
		Token:       NewLeaseToken(),
	}
	if r.Wait <= 0 {
		return s.store.Claim(ctx, c)
	}

	c.Waiting = true
	deadline := time.Now().Add(r.Wait)
	// Watch before the first claim, so that a change between that claim's answer and
	// the wait below is not missed.
	w, err := s.store.Watch(ctx, r.ID)
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
		res, err := s.store.Claim(ctx, c)
		var busy *InProgressError
		if !errors.As(err, &busy) {
			return res, err
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
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
		}
	}
}

// Complete stores the result of a held key.
func (s *Service) Complete(ctx context.Context, c Completion) (Record, error) {
	if c.Retention == 0 {
		c.Retention = s.retention
	}
	return s.store.Complete(ctx, c)
}

// Release gives a held key back.
func (s *Service) Release(ctx context.Context, r Release) (Record, error) {
	if r.Retention == 0 {
		r.Retention = s.retention
	}
	return s.store.Release(ctx, r)
}

// Extend renews a held lease.
func (s *Service) Extend(ctx context.Context, e Extension) (Record, error) {
	return s.store.Extend(ctx, e)
}

// Lookup returns a record.
func (s *Service) Lookup(ctx context.Context, id ID) (Record, error) {
	return s.store.Lookup(ctx, id)
}

// Purge deletes a record.
func (s *Service) Purge(ctx context.Context, id ID) error {
	return s.store.Purge(ctx, id)
}

// Ready reports whether the store can take writes.
func (s *Service) Ready(ctx context.Context) error {
	return s.store.Ping(ctx)
}
