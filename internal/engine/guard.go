package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Fill is how full a store is: Used of Limit bytes on its fullest part (the fullest
// Redis master, or the embedded store's file against its size or its disk). Limit is
// zero when the store has no limit to measure against (a Redis without maxmemory).
type Fill struct {
	Used, Limit int64
}

// Ratio is Used over Limit, zero without a limit.
func (f Fill) Ratio() float64 {
	if f.Limit <= 0 {
		return 0
	}
	return float64(f.Used) / float64(f.Limit)
}

// FillReader is a Store that says how full it is.
type FillReader interface {
	Fill(ctx context.Context) (Fill, error)
}

// DefaultGuardThreshold is the fill past which the store guard holds the tenants that
// keep the most back, unless WithStoreGuard says otherwise.
const DefaultGuardThreshold = 0.9

// fillRefresh is how old the store's fill may be while it is well under the guard's
// threshold; within guardWatch of it, every acquisition starts a read. fillStale is how
// old a fill may be and still count: past it (the store has not answered a read for
// that long), the guard refuses nothing.
const (
	fillRefresh = 500 * time.Millisecond
	guardWatch  = 0.1
	fillStale   = 10 * time.Second
)

// WithStoreGuard sets the store guard: past threshold (a fraction of the store's
// limit, 0 to turn the guard off), a claim that would acquire a key is refused to any
// tenant that keeps more than its fair share, the usage of all tenants over their
// number. tenants names them (the auth file's), and is asked at each decision.
func WithStoreGuard(threshold float64, tenants func() []string) Option {
	return func(s *Service) {
		s.guard.threshold, s.guard.tenants = threshold, tenants
	}
}

// storeGuard is the state of the guard: the fill last read, when that read began, and
// the read under way (closed when it ends), if any.
type storeGuard struct {
	threshold float64
	tenants   func() []string
	mu        sync.Mutex
	fill      Fill
	read      time.Time
	reading   chan struct{}
	// written is about how many bytes this daemon has written since the last fill
	// read began (keys acquired, results, failures, points, imports), and
	// writtenBefore what of it was written before the read under way began, which
	// that read counts. Writers faster than the reads would otherwise take the store
	// past the threshold between two reads, and on to refusing every write.
	written, writtenBefore int64
}

// wrote adds about n bytes that this daemon wrote to the store to what the guard
// counts on top of the fill it last read.
func (s *Service) wrote(n int64) {
	g := &s.guard
	if g.threshold <= 0 || n <= 0 {
		return
	}
	g.mu.Lock()
	g.written += n
	g.mu.Unlock()
}

// projected is the fill as last read with what this daemon wrote since added; the
// caller holds the guard's lock.
func (g *storeGuard) projected() Fill {
	return Fill{Used: g.fill.Used + g.written, Limit: g.fill.Limit}
}

// fairShare is the Field of the guard's *QuotaError: the store is nearly full, and
// the tenant keeps more than its share of what the tenants keep.
const fairShare = "fair_share"

// StoreFill returns the store's fill as last read. A fill read more than fillRefresh
// ago, or within guardWatch of the guard's threshold, has a new read started in the
// background, one at a time; only a daemon's first read is waited for. So a store part
// that stops answering (one Cluster master of many) holds up no claim: the guard goes
// on with the last fill until it is fillStale, and then refuses nothing.
func (s *Service) StoreFill(ctx context.Context) (Fill, error) {
	reader, ok := s.store.(FillReader)
	if !ok {
		return Fill{}, fmt.Errorf("the store does not say how full it is")
	}
	g := &s.guard
	g.mu.Lock()
	fresh := !g.read.IsZero() && time.Since(g.read) < fillRefresh && (g.threshold <= 0 || g.projected().Ratio() < g.threshold-guardWatch)
	if !fresh && g.reading == nil {
		g.reading = make(chan struct{})
		g.writtenBefore = g.written
		go s.readFill(reader, g.reading)
	}
	fill, read, reading := g.fill, g.read, g.reading
	g.mu.Unlock()
	if read.IsZero() {
		select {
		case <-reading:
		case <-ctx.Done():
			return Fill{}, ctx.Err()
		}
		g.mu.Lock()
		fill, read = g.fill, g.read
		g.mu.Unlock()
		if read.IsZero() {
			return Fill{}, Unavailable(errors.New("the store's fill could not be read"))
		}
	}
	if age := time.Since(read); age > fillStale {
		return Fill{}, Unavailable(fmt.Errorf("the store's fill was last read %s ago", age.Round(time.Second)))
	}
	return fill, nil
}

// readFill reads the store's fill under the store deadline, keeps it if the read
// succeeds, and closes done.
func (s *Service) readFill(reader FillReader, done chan struct{}) {
	began := time.Now()
	fill, err := bounded(s, context.Background(), reader.Fill)
	g := &s.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		g.fill, g.read = fill, began
		g.written -= g.writtenBefore
	}
	g.writtenBefore = 0
	g.reading = nil
	close(done)
}

// guarded returns the refusal of the store guard for a claim of tenant that would
// acquire a key, or nil. A fill or usage that cannot be read refuses nothing.
func (s *Service) guarded(ctx context.Context, tenant string) *QuotaError {
	g := &s.guard
	if g.threshold <= 0 || g.tenants == nil {
		return nil
	}
	if _, ok := s.store.(FillReader); !ok {
		return nil
	}
	// What this daemon wrote since the last read counts, so that the guard holds the
	// largest tenants back before the store passes the threshold, not a read after.
	if _, err := s.StoreFill(ctx); err != nil {
		return nil
	}
	g.mu.Lock()
	fill := g.projected()
	g.mu.Unlock()
	if fill.Ratio() < g.threshold {
		return nil
	}
	names := g.tenants()
	if len(names) < 2 {
		// A single tenant has nobody to leave room for.
		return nil
	}
	var total int64
	var mine Usage
	for _, name := range names {
		u, err := s.Usage(ctx, name)
		if err != nil {
			return nil
		}
		total += u.Bytes
		if name == tenant {
			mine = u
		}
	}
	share := total / int64(len(names))
	if mine.Bytes <= share {
		return nil
	}
	e := &QuotaError{Tenant: tenant, Usage: mine, Field: fairShare, Used: mine.Bytes, Limit: share}
	if !mine.NextDrop.IsZero() {
		e.RetryAfter = max(time.Until(mine.NextDrop), time.Millisecond)
	}
	return e
}
