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

// usageTimeout bounds one read of a tenant's usage: a read may wait for the daemon's
// own writes of the tenant under way, which takes longer than a transition.
const usageTimeout = 10 * time.Second

// acquisitionEstimate is what the Service adds to a tenant's usage, until the next read
// from the store, for each key it acquires: about what a pending record keeps besides
// its key, fingerprint and owner. It keeps a burst of acquisitions between two reads
// from overshooting a quota by more than a few records.
const acquisitionEstimate = 300

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
	// inflight counts the claims admitted under the quota that have not answered yet:
	// each holds its room until it answers, so that claims arriving together cannot all
	// take the last of the quota.
	inflight Usage
}

// reservation is the room a claim in flight holds under its tenant's quota; settle
// turns it into an acquisition or gives it back.
type reservation struct {
	t         *tenantUsage
	hold      Usage
	retention time.Duration
}

// acquisition is a key this daemon acquired: when the store answered, about what the
// record keeps, and when it expires if its holder never comes back, when it stops
// counting.
type acquisition struct {
	at, expires time.Time
	// records is 1 for a key acquired or imported, 0 for a result or point written.
	records, bytes int64
}

// Usage returns a tenant's usage as the store counts it, read at most the refresh
// interval ago (a read that fails leaves the last one) and after whatever this daemon
// wrote while the last read ran, with what this daemon acquired since added. A store
// that does not count usage answers ErrUnsupported.
func (s *Service) Usage(ctx context.Context, tenant string) (Usage, error) {
	u, unsure, err := s.tenantUsage(ctx, tenant, time.Time{})
	if err == nil && (unsure.Records > 0 || unsure.Bytes > 0) {
		// The last read ran while this daemon wrote, and may have missed some of it:
		// a read begun now counts all of it.
		u, _, err = s.tenantUsage(ctx, tenant, time.Now())
	}
	return u, err
}

// tenantUsage is Usage, and the acquisitions that the last read may not have counted
// (see readUsage), which it does not count either. With after set, it waits for a read
// that began at or after that time, starting one if the last began before.
func (s *Service) tenantUsage(ctx context.Context, tenant string, after time.Time) (Usage, Usage, error) {
	t, err := s.tenantRead(ctx, tenant, after)
	if err != nil {
		return Usage{}, Usage{}, err
	}
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	return t.counted(time.Now()), t.unsure, nil
}

// tenantRead returns the tenant's usage entry once it holds a read of the store; with
// after set, one that began at or after that time, starting one if the last began before.
func (s *Service) tenantRead(ctx context.Context, tenant string, after time.Time) (*tenantUsage, error) {
	reader, ok := s.store.(UsageReader)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
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
			s.usage.mu.Lock()
			return nil, ctx.Err()
		}
		s.usage.mu.Lock()
	}
	if t.read.IsZero() {
		return nil, Unavailable(errors.New("the tenant's usage could not be read"))
	}
	return t, nil
}

// counted is the tenant's usage as last read with this daemon's acquisitions since
// added, those whose records have not expired by now; the caller holds the cache's lock.
func (t *tenantUsage) counted(now time.Time) Usage {
	u := t.usage
	for _, a := range t.since {
		if !a.expires.After(now) {
			continue
		}
		u.Records += a.records
		u.Bytes += a.bytes
		if u.NextDrop.IsZero() || a.expires.Before(u.NextDrop) {
			u.NextDrop = a.expires
		}
	}
	return u
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
				unsure.Records += a.records
				unsure.Bytes += a.bytes
			}
		}
		t.usage, t.read, t.since, t.unsure = u, began, t.since[:0], unsure
	}
	close(t.reading)
	t.reading = nil
}

// claimBytes is about what a claim's pending record keeps.
func claimBytes(c Claim) int64 {
	return int64(len(c.ID.Key)+len(c.Fingerprint)+len(c.Owner)) + acquisitionEstimate
}

// acquired adds a key this daemon acquired to the tenant's usage until the next read.
func (s *Service) acquired(id ID, c Claim) {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	if t := s.usage.tenants[id.Tenant]; t != nil {
		now := time.Now()
		t.since = append(t.since, acquisition{at: now, expires: now.Add(c.Retention), records: 1, bytes: claimBytes(c)})
	}
}

// settle ends a claim's reservation when the claim has answered: an acquisition
// counts on until the next read, anything else gives the room back. A read begun
// after the store answered counted the acquisition already.
func (s *Service) settle(r *reservation, acquired bool, answered time.Time) {
	if r == nil {
		return
	}
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	t := r.t
	t.inflight.Records -= r.hold.Records
	t.inflight.Bytes -= r.hold.Bytes
	if acquired && !answered.Before(t.read) {
		t.since = append(t.since, acquisition{at: answered, expires: answered.Add(r.retention), records: r.hold.Records, bytes: r.hold.Bytes})
	}
}

// admit decides whether a claim may go to the store. Under its tenant's quota and the
// store guard, it may, and holds its room under the quota until it answers (the
// reservation, nil for a tenant without a quota, is the caller's to settle). At or over
// either, a claim may still replay a result, or hear that a live lease holds the key,
// or get its own lease back by its secret: only a claim that would acquire the key
// (absent, released for a retry, or pending under a lease that ran out) is refused.
// The record is looked up first; a record that changes between the look and the claim
// lets at most that one claim through.
func (s *Service) admit(ctx context.Context, r ClaimRequest, c Claim) (*reservation, error) {
	var held *reservation
	over := s.guarded(ctx, r.ID.Tenant)
	if over == nil {
		if r.Caps.HasQuota() {
			held, over = s.reserve(ctx, r.ID.Tenant, r.Caps, Usage{Records: 1, Bytes: 1}, Usage{Records: 1, Bytes: claimBytes(c)}, c.Retention)
		}
	}
	if over == nil {
		return held, nil
	}
	rec, err := s.Lookup(ctx, r.ID)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, over
	case err != nil:
		return nil, err
	case rec.State == StateCompleted || rec.State == StateFailed:
		return nil, nil
	case rec.State == StatePending && rec.LeaseExpiresAt.After(time.Now()):
		return nil, nil
	}
	return nil, over
}

// reserve returns the refusal of a write that would take a tenant past caps' quota,
// or, within it, the write's reservation of hold until it answers: what the store last
// counted, what this daemon wrote since and what its writes in flight hold, with need,
// stays within the quota. A refusal rests on a read of the store begun after the write
// arrived, never on the estimates alone (the acquisitions since may have expired, or
// been smaller), and reports the usage that read found; a usage that cannot be read
// refuses nothing: the quota protects the store's room, not a key's safety, and the
// write answers for the store itself.
func (s *Service) reserve(ctx context.Context, tenant string, caps Caps, need, hold Usage, retention time.Duration) (*reservation, *QuotaError) {
	// The cached usage first, and a read begun now where it would refuse. Both count
	// this daemon's writes that answered while their read ran, which that read may not
	// have counted (see readUsage): taken as counted, a tenant near its quota could be
	// let past it by as many claims as answered during one read.
	arrived := time.Now()
	var after time.Time
	for range 2 {
		// A read is waited for no longer than a store call: a daemon just started does
		// not hold its first claims up behind a slow count.
		readCtx, cancel := context.WithTimeout(ctx, s.storeTimeout)
		t, err := s.tenantRead(readCtx, tenant, after)
		cancel()
		if err != nil {
			return nil, nil
		}
		s.usage.mu.Lock()
		now := time.Now()
		read := t.counted(now)
		u := read
		u.Records += t.inflight.Records + t.unsure.Records
		u.Bytes += t.inflight.Bytes + t.unsure.Bytes
		over := overQuota(tenant, u, need, caps, now)
		if over == nil {
			t.inflight.Records += hold.Records
			t.inflight.Bytes += hold.Bytes
			s.usage.mu.Unlock()
			return &reservation{t: t, hold: hold, retention: retention}, nil
		}
		s.usage.mu.Unlock()
		if !after.IsZero() {
			// The usage is the store's, as this read found it, with what this daemon
			// wrote after the read began; what is in flight, or answered while the read
			// ran, counts in Used alone.
			over.Usage = read
			if over.RetryAfter <= 0 {
				// Nothing counted is known to expire: what fills the quota is in
				// flight, or counted by a store that does not say when it drops.
				over.RetryAfter = max(s.usage.refresh, time.Second)
			}
			return nil, over
		}
		after = arrived
	}
	return nil, nil
}

// A tenant with a byte quota keeps the results of the leases it holds whole while they
// keep it within wholeAllowance (in quarters) of its max_stored_bytes, as this daemon
// counts it; past that, a result is stored as NotStoredResponse. Its few bytes (under
// two thirds of what the pending record it completes kept) added to every lease the
// tenant may hold (claims stop at max_stored_bytes) keep it within twice its
// max_stored_bytes.
const wholeAllowance = 5

// NotStoredResponse is what a completion or failure stores in place of a response that
// would take its tenant past its allowance: a 409 response_not_stored problem, the
// answer an SDK's middleware stores for a response it cannot keep, so that a replay
// tells the client that the operation ran and its answer is gone. It is kept short,
// since every lease a tenant holds may end in one.
func NotStoredResponse() Response {
	return Response{Status: 409, Headers: map[string][]string{"content-type": {"application/problem+json"}},
		Body: []byte(`{"status":409,"code":"response_not_stored","title":"Response not stored"}`)}
}

// writeEstimate is about what n bytes of a result or point add to a record as a store
// counts them, rounded up: the embedded store keeps a body in base64, in JSON.
func writeEstimate(n int) int64 { return int64(n)*3/2 + 64 }

// reserveWrite holds room for a result or point of n bytes that a tenant with a byte
// quota stores under a lease, within wholeAllowance; nil, false where it would pass
// that. A tenant without a byte quota, or a store whose usage cannot be read, writes
// freely (nil, true).
func (s *Service) reserveWrite(ctx context.Context, tenant string, caps Caps, n int, retention time.Duration) (*reservation, *QuotaError) {
	if caps.MaxStoredBytes <= 0 || n == 0 {
		return nil, nil
	}
	hold := Usage{Bytes: writeEstimate(n)}
	return s.reserve(ctx, tenant, Caps{MaxStoredBytes: wholeAllowance * caps.MaxStoredBytes / 4}, hold, hold, retention)
}

// hold counts what a write of n bytes that is not held to the quota adds, until it
// answers, as reserveWrite's reservation would.
func (s *Service) hold(tenant string, n int, retention time.Duration) *reservation {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	t := s.usage.tenants[tenant]
	if t == nil {
		return nil
	}
	r := &reservation{t: t, hold: Usage{Bytes: writeEstimate(n)}, retention: retention}
	t.inflight.Bytes += r.hold.Bytes
	return r
}
