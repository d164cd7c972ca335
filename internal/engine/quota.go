package engine

import (
	"context"
	"errors"
	"sync"
	"time"
)

// DefaultUsageRefresh is how old a tenant's usage may be before the Service reads it
// from the store again, when WithUsageRefresh does not say.
const DefaultUsageRefresh = 2 * time.Second

// usageTimeout bounds one read of a tenant's usage: on a Redis Cluster it reads every
// slot of the tenant, which takes longer than a transition.
const usageTimeout = 10 * time.Second

// acquisitionEstimate is what the Service adds to a tenant's usage, until the next read
// from the store, for each key it acquires: about what a pending record keeps besides
// its key, fingerprint and owner. It keeps a burst of acquisitions between two reads
// from overshooting a quota by more than a few records.
const acquisitionEstimate = 160

// WithUsageRefresh sets how old the usage a quota is checked against may be; the
// store is read again, in the background, once it is older.
func WithUsageRefresh(d time.Duration) Option {
	return func(s *Service) {
		if d > 0 {
			s.usage.refresh = d
		}
	}
}

// usageCache holds the last usage read of each tenant with a quota, and what this
// daemon acquired since that read began.
type usageCache struct {
	refresh time.Duration
	mu      sync.Mutex
	tenants map[string]*tenantUsage
}

type tenantUsage struct {
	usage Usage
	// read is when the last read that answered began; zero before the first.
	read time.Time
	// reading is closed when the read under way answers; nil when none is.
	reading chan struct{}
	// since are this daemon's acquisitions after the last read.
	since []acquisition
	// unsure counts the acquisitions that answered while the last read ran: that read
	// may or may not have counted them.
	unsure Usage
}

// acquisition is a key this daemon acquired: when the store answered, and about what
// the record keeps.
type acquisition struct {
	at    time.Time
	bytes int64
}

// Usage returns a tenant's usage as the store counts it, read at most the refresh
// interval ago (a read that fails leaves the last one), with what this daemon acquired
// since added. A store that does not count usage answers ErrUnsupported.
func (s *Service) Usage(ctx context.Context, tenant string) (Usage, error) {
	u, _, err := s.tenantUsage(ctx, tenant, time.Time{})
	return u, err
}

// tenantUsage is Usage, and the acquisitions that the last read may not have counted
// (see readUsage), which it does not count either. With after set, it waits for a read that began
// at or after that time, starting one if the last began before.
func (s *Service) tenantUsage(ctx context.Context, tenant string, after time.Time) (Usage, Usage, error) {
	reader, ok := s.store.(UsageReader)
	if !ok {
		return Usage{}, Usage{}, errors.ErrUnsupported
	}
	s.usage.mu.Lock()
	if s.usage.tenants == nil {
		s.usage.tenants = make(map[string]*tenantUsage)
	}
	t := s.usage.tenants[tenant]
	if t == nil {
		t = &tenantUsage{}
		s.usage.tenants[tenant] = t
	}
	// A read under way that began before after answers too early; at most two reads
	// are waited for, the one under way and the one begun after it.
	for range 2 {
		stale := time.Since(t.read) >= s.usage.refresh
		if (stale || t.read.Before(after)) && t.reading == nil {
			t.reading = make(chan struct{})
			go s.readUsage(reader, tenant, t, time.Now())
		}
		reading := t.reading
		if reading == nil || !t.read.IsZero() && !t.read.Before(after) {
			break
		}
		s.usage.mu.Unlock()
		select {
		case <-reading:
		case <-ctx.Done():
			return Usage{}, Usage{}, ctx.Err()
		}
		s.usage.mu.Lock()
	}
	defer s.usage.mu.Unlock()
	if t.read.IsZero() {
		return Usage{}, Usage{}, Unavailable(errors.New("the tenant's usage could not be read"))
	}
	u := t.usage
	for _, a := range t.since {
		u.Records++
		u.Bytes += a.bytes
	}
	return u, t.unsure, nil
}

// readUsage reads a tenant's usage in the background, so that no request waits for it
// but the first and those that need it fresh.
func (s *Service) readUsage(reader UsageReader, tenant string, t *tenantUsage, began time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), usageTimeout)
	defer cancel()
	u, err := reader.Usage(ctx, tenant)
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	if err == nil {
		// What was acquired while the read ran, it may or may not have counted: taken
		// as counted, so that a tenant is never refused on a count of its own making,
		// and remembered as unsure, so that a claim near the quota reads again (see
		// overQuota). What was acquired before the read began, it counted.
		var unsure Usage
		for _, a := range t.since {
			if !a.at.Before(began) {
				unsure.Records++
				unsure.Bytes += a.bytes
			}
		}
		t.usage, t.read, t.since, t.unsure = u, began, t.since[:0], unsure
	}
	close(t.reading)
	t.reading = nil
}

// acquired adds a key this daemon acquired to the tenant's usage until the next read.
func (s *Service) acquired(id ID, c Claim) {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	if t := s.usage.tenants[id.Tenant]; t != nil {
		t.since = append(t.since, acquisition{at: time.Now(), bytes: int64(len(id.Key)+len(c.Fingerprint)+len(c.Owner)) + acquisitionEstimate})
	}
}

// admit decides whether a claim may go to the store. Under its tenant's quota and the
// store guard, it may. At or over either, a claim may still replay a result, or hear that a
// live lease holds the key, or get its own lease back by its secret: only a claim that
// would acquire the key (absent, released for a retry, or pending under a lease that
// ran out) is refused. The record is looked up first; a record that changes between
// the look and the claim lets at most that one claim through.
func (s *Service) admit(ctx context.Context, r ClaimRequest) error {
	over := s.guarded(ctx, r.ID.Tenant)
	if over == nil {
		over = s.overQuota(ctx, r)
	}
	if over == nil {
		return nil
	}
	rec, err := s.Lookup(ctx, r.ID)
	switch {
	case errors.Is(err, ErrNotFound):
		return over
	case err != nil:
		return err
	case rec.State == StateCompleted || rec.State == StateFailed:
		return nil
	case rec.State == StatePending && rec.LeaseExpiresAt.After(time.Now()):
		return nil
	}
	return over
}

// overQuota returns the refusal of a claim from a tenant at its quota, or nil. It
// refuses only on a usage read within the refresh interval, so that a tenant whose
// records expired since is not held back by an old count; a usage that cannot be read
// refuses nothing: the quota protects the store's room, not a key's safety, and the
// claim answers for the store itself.
func (s *Service) overQuota(ctx context.Context, r ClaimRequest) *QuotaError {
	if !r.Caps.HasQuota() {
		return nil
	}
	// The cached usage first; a fresh read where it would refuse (it may be older than
	// records that expired since), or where it admits only because it leaves out this
	// daemon's acquisitions that answered while the last read ran, which that read may
	// not have counted: a read begun now counts every acquisition that answered before
	// this claim arrived.
	arrived := time.Now()
	var after time.Time
	for range 2 {
		// The first read of a tenant's usage is waited for no longer than a store call:
		// a daemon just started does not hold its first claims up behind a slow count.
		readCtx, cancel := context.WithTimeout(ctx, s.storeTimeout)
		u, unsure, err := s.tenantUsage(readCtx, r.ID.Tenant, after)
		cancel()
		if err != nil {
			return nil
		}
		over := overQuota(r.ID.Tenant, u, r.Caps, time.Now())
		if !after.IsZero() {
			return over
		}
		switch {
		case over != nil:
			after = arrived.Add(-s.usage.refresh)
		case unsure.Records > 0 && overQuota(r.ID.Tenant, Usage{Records: u.Records + unsure.Records, Bytes: u.Bytes + unsure.Bytes}, r.Caps, time.Now()) != nil:
			after = arrived
		default:
			return nil
		}
	}
	return nil
}
