package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the live move: daemons keep serving while the records of one store
// (the old) move into another (the new). docs/operations.md ("Moving to another store
// while serving") gives the procedure and the argument for its safety.
//
// Each key is handed over through the old store, in two atomic steps there: MoveOut
// replaces the old record with a moving marker that keeps the record whole (its lease
// token included), or seals a key with no live record with a moved marker; the record
// is then imported into the new store (conditionally: never over a record the new
// store holds); ConfirmMoved then turns the moving marker into a moved one, which keeps
// nothing. Whoever meets a moving marker (a migrating daemon, the copier, after a
// crash) imports its copy again and confirms: the import finds its own earlier write
// (ImportSame) or a record the new store has since changed (ImportKept), and keeps it.

// MoveOutcome is what MoveOut found and left.
type MoveOutcome string

// The outcomes of MoveOut.
const (
	// MoveHandingOver: the key's record, to import into the new store, and the old
	// store now holds a moving marker that keeps it.
	MoveHandingOver MoveOutcome = "moving"
	// MoveSealed: there is nothing to import: the key was moved before, or had no live
	// record, and the old store holds a moved marker that hands it out to nobody.
	MoveSealed MoveOutcome = "moved"
)

// MarkerLife is how long a marker is kept: as long as the longest retention a record
// may be given, not the record's own expiry, since the new store may keep the record
// (a claim on a released key, an extension) longer than the old one would have.
const MarkerLife = MaxRetention

// Mover is what a store offers to be moved out of while daemons serve it.
type Mover interface {
	// MoveOut hands the key (tenant and the SHA-256 of the client's key; key is the
	// client's key where known, else "") over, atomically: a live record becomes a
	// moving marker kept until until, and is answered whole; a moving marker answers
	// the record it keeps; a moved marker stays, answered MoveSealed, and so does a
	// key with no live record, which becomes a moved marker when seal is set (before
	// a claim, which may create the key in the new store) and stays as it is
	// otherwise. Waiters on the key are woken.
	MoveOut(ctx context.Context, tenant string, digest [32]byte, key string, seal bool, until time.Time) (MoveOutcome, *Exported, error)
	// ConfirmMoved turns a moving marker into a moved one kept until until, dropping
	// the record it kept. On anything else it does nothing.
	ConfirmMoved(ctx context.Context, tenant string, digest [32]byte, until time.Time) error
	// Unmoved calls fn for every key that still has to be handed over (a live record
	// or a moving marker), in an order of the store's choosing, while the store keeps
	// serving; moved reports how many moved markers it passed.
	Unmoved(ctx context.Context, fn func(tenant string, digest [32]byte, key string) error) (moved int64, err error)

	// The copier hands keys over in batches, each key's step the same atomic step as
	// alone, so that every guarantee of one key's handover holds for each; the store
	// sends a batch's steps together (a pipeline to each Redis master, one bbolt
	// commit).

	// UnmovedBatches calls fn with batches of the keys that may still have to be handed
	// over: every key Unmoved would list, and perhaps keys holding moved markers where
	// telling those apart would cost a read of each (MoveOut answers them MoveSealed
	// and leaves them). fn may be called from several goroutines at once (a Cluster's
	// masters are listed in parallel), and must not keep the slice.
	UnmovedBatches(ctx context.Context, fn func([]MoveKey) error) error
	// MoveOutBatch is MoveOut on each key, answered in the keys' order.
	MoveOutBatch(ctx context.Context, keys []MoveKey, seal bool, until time.Time) []MovedOut
	// ConfirmMovedBatch is ConfirmMoved on each key, its error in the keys' order.
	ConfirmMovedBatch(ctx context.Context, keys []MoveKey, until time.Time) []error
}

// DaemonCounter is what an old store offers to tell whether daemons still serve it
// alone: the Redis store counts the connections named as idemd daemons' are (those of
// migrating daemons are named otherwise). A store opened by one process only (the
// embedded store) needs none.
type DaemonCounter interface {
	Daemons(ctx context.Context) (int, error)
}

// Census is who is connected to an old store, as a live move needs to know.
type Census struct {
	// Alone describes the daemons that serve the old store alone and know markers (their
	// heartbeats say so), one line each: while there are any, they may write records
	// there that are not moved yet.
	Alone []string
	// Unknown describes the connections that do not identify as daemons that write
	// heartbeats: each may be a daemon of an earlier release, which may not know markers
	// and writes records there too.
	Unknown []string
}

// ClientCensus is what an old store offers to tell who is connected to it: the Redis
// store tells daemons by their connections' names and heartbeats. A store opened by
// one process only (the embedded store) needs none.
type ClientCensus interface {
	Census(ctx context.Context) (Census, error)
}

// censusEvery is how often a migrator that may not yet write markers looks again.
const censusEvery = time.Second

// Migrator is a Store that serves every key from the new store, after handing it over
// from the old one: the daemon's store while a live move runs. Until no connection to
// the old store may be a daemon that does not know markers (Census.Unknown), it writes
// no marker: it serves from the old store as its own daemons do, and its copier waits.
// Once it has written one it goes on, whoever connects later.
type Migrator struct {
	next     Store
	nextPort Porter
	old      Mover
	oldStore Store
	now      func() time.Time
	// HandedOver counts the keys this migrator imported from the old store (records
	// written into the new one, or found there already), Sealed those it found moved
	// or absent there.
	handedOver, sealed atomic.Int64
	// markers is set once the migrator may write markers; gateMu guards the look that
	// sets it, census and censusAt the last such look.
	markers  atomic.Bool
	gateMu   sync.Mutex
	census   Census
	censusAt time.Time
}

// markersAllowed says whether the migrator may write markers into the old store: once
// a census found no connection there that may be a daemon that does not know them, and
// ever after. It looks again at most every censusEvery.
func (m *Migrator) markersAllowed(ctx context.Context) (bool, error) {
	if m.markers.Load() {
		return true, nil
	}
	cc, ok := m.oldStore.(ClientCensus)
	if !ok {
		m.markers.Store(true)
		return true, nil
	}
	m.gateMu.Lock()
	defer m.gateMu.Unlock()
	if m.markers.Load() {
		return true, nil
	}
	if !m.censusAt.IsZero() && m.now().Sub(m.censusAt) < censusEvery {
		return false, nil
	}
	c, err := cc.Census(ctx)
	if err != nil {
		return false, err
	}
	m.census, m.censusAt = c, m.now()
	if len(c.Unknown) == 0 {
		m.markers.Store(true)
		return true, nil
	}
	return false, nil
}

// lastCensus is the census that keeps the migrator from writing markers.
func (m *Migrator) lastCensus() Census {
	m.gateMu.Lock()
	defer m.gateMu.Unlock()
	return m.census
}

// route returns the store to serve id from: the new one, having handed the key over,
// or the old one while the migrator may write no marker.
func (m *Migrator) route(ctx context.Context, id ID, seal bool) (Store, error) {
	ok, err := m.markersAllowed(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return m.oldStore, nil
	}
	if err := m.handOver(ctx, id, seal); err != nil {
		return nil, err
	}
	return m.next, nil
}

// NewMigrator serves from next, handing each key over from old first. next must be a
// Porter and old a Mover.
func NewMigrator(next, old Store) (*Migrator, error) {
	np, ok := next.(Porter)
	if !ok {
		return nil, fmt.Errorf("%T cannot import records: %w", next, ErrNoPorter)
	}
	om, ok := old.(Mover)
	if !ok {
		return nil, fmt.Errorf("%T cannot hand records over while it serves", old)
	}
	return &Migrator{next: next, nextPort: np, old: om, oldStore: old, now: time.Now}, nil
}

// Next is the store the migrator serves from.
func (m *Migrator) Next() Store { return m.next }

// Usage implements UsageReader with the new store's count, where it keeps one: a
// tenant's records still in the old store count once they are handed over.
func (m *Migrator) Usage(ctx context.Context, tenant string) (Usage, error) {
	if r, ok := m.next.(UsageReader); ok {
		return r.Usage(ctx, tenant)
	}
	return Usage{}, errors.ErrUnsupported
}

// Fill implements FillReader with the new store's.
func (m *Migrator) Fill(ctx context.Context) (Fill, error) {
	if r, ok := m.next.(FillReader); ok {
		return r.Fill(ctx)
	}
	return Fill{}, errors.ErrUnsupported
}

// Counts are how many keys this migrator handed over and sealed.
func (m *Migrator) Counts() (handedOver, sealed int64) { return m.handedOver.Load(), m.sealed.Load() }

// handOver makes sure the new store can serve id: it holds the key's record, or the
// old store has handed the key over, or holds none of it (sealed against the daemons
// of the old store alone when seal is set: before a claim, the one call that creates
// a record; the others create none, and leave the old store as it is).
func (m *Migrator) handOver(ctx context.Context, id ID, seal bool) error {
	_, err := m.next.Lookup(ctx, id)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return err
	}
	return m.move(ctx, id.Tenant, KeyDigest(id.Key), id.Key, seal)
}

// Move hands one key over from the old store to the new one: MoveOut, a conditional
// import of what it answers, ConfirmMoved. Run again after an interruption at any
// point, it finishes the handover and changes nothing already done.
func (m *Migrator) Move(ctx context.Context, tenant string, digest [32]byte, key string) error {
	return m.move(ctx, tenant, digest, key, true)
}

func (m *Migrator) move(ctx context.Context, tenant string, digest [32]byte, key string, seal bool) error {
	outcome, e, err := m.old.MoveOut(ctx, tenant, digest, key, seal, m.now().Add(MarkerLife))
	if err != nil {
		return err
	}
	if outcome == MoveSealed {
		m.sealed.Add(1)
		return nil
	}
	if e.ID.Key == "" {
		e.ID.Key = key
	}
	if _, err := m.nextPort.Import(ctx, *e); err != nil {
		return err
	}
	if err := m.old.ConfirmMoved(ctx, tenant, digest, m.now().Add(MarkerLife)); err != nil {
		return err
	}
	m.handedOver.Add(1)
	return nil
}

// Claim implements Store.
func (m *Migrator) Claim(ctx context.Context, c Claim) (ClaimResult, error) {
	s, err := m.route(ctx, c.ID, true)
	if err != nil {
		return ClaimResult{}, err
	}
	return s.Claim(ctx, c)
}

// Complete implements Store.
func (m *Migrator) Complete(ctx context.Context, c Completion) (Record, error) {
	s, err := m.route(ctx, c.ID, false)
	if err != nil {
		return Record{}, err
	}
	return s.Complete(ctx, c)
}

// Release implements Store.
func (m *Migrator) Release(ctx context.Context, r Release) (Record, error) {
	s, err := m.route(ctx, r.ID, false)
	if err != nil {
		return Record{}, err
	}
	return s.Release(ctx, r)
}

// Extend implements Store.
func (m *Migrator) Extend(ctx context.Context, e Extension) (Record, error) {
	s, err := m.route(ctx, e.ID, false)
	if err != nil {
		return Record{}, err
	}
	return s.Extend(ctx, e)
}

// Mark implements Store.
func (m *Migrator) Mark(ctx context.Context, mk Mark) (Record, error) {
	s, err := m.route(ctx, mk.ID, false)
	if err != nil {
		return Record{}, err
	}
	return s.Mark(ctx, mk)
}

// Lookup implements Store: a key the old store still holds is handed over first, so
// that a lookup never reports a key free that the old store holds.
func (m *Migrator) Lookup(ctx context.Context, id ID) (Record, error) {
	s, err := m.route(ctx, id, false)
	if err != nil {
		return Record{}, err
	}
	return s.Lookup(ctx, id)
}

// Purge implements Store: the key is handed over, and the old store left with a moved
// marker of it (confirmed, so that no copy of the record there is imported again),
// then purged from the new one.
func (m *Migrator) Purge(ctx context.Context, id ID) error {
	s, err := m.route(ctx, id, true)
	if err != nil {
		return err
	}
	if s == m.oldStore {
		return s.Purge(ctx, id)
	}
	if err := m.old.ConfirmMoved(ctx, id.Tenant, KeyDigest(id.Key), m.now().Add(MarkerLife)); err != nil {
		return err
	}
	return m.next.Purge(ctx, id)
}

// Watch implements Store, on the new store once the key is there.
func (m *Migrator) Watch(ctx context.Context, id ID) (Watch, error) {
	s, err := m.route(ctx, id, false)
	if err != nil {
		return nil, err
	}
	return s.Watch(ctx, id)
}

// Abandoned implements Store from the new store: a key abandoned in the old store is
// listed once it is handed over (by a call on it, or the copier).
func (m *Migrator) Abandoned(ctx context.Context, q AbandonedQuery) (AbandonedPage, error) {
	ok, err := m.markersAllowed(ctx)
	if err != nil {
		return AbandonedPage{}, err
	}
	if !ok {
		return m.oldStore.Abandoned(ctx, q)
	}
	return m.next.Abandoned(ctx, q)
}

// Ping implements Store: both stores must answer.
func (m *Migrator) Ping(ctx context.Context) error {
	if err := m.next.Ping(ctx); err != nil {
		return err
	}
	return m.oldStore.Ping(ctx)
}

// Close implements Store, closing both.
func (m *Migrator) Close() error {
	return errors.Join(m.next.Close(), m.oldStore.Close())
}

// MoveProgress is where the copier of a live move stands.
type MoveProgress struct {
	// Moved counts the keys the copier handed over, Passed the moved markers its last
	// pass found, Failed the keys it could not hand over, and Left the keys its pass
	// still has to hand over (counted by a look over the old store at the pass's start).
	Moved, Passed, Failed, Left int64
	Started                     time.Time
	// AloneDaemons counts the daemons that still serve the old store alone, and the
	// connections there that may be daemons that do not know markers, at the last pass
	// that found nothing left: while there are any, they may write records there that
	// are not moved yet, and the copier is not done.
	AloneDaemons int
	// Waiting says what the copier waits for, one line each: connections that may be
	// daemons that do not know markers (before it writes any marker, and before it is
	// done), daemons serving the old store alone (before it is done).
	Waiting []string
	// Done: a whole pass found nothing left to hand over while no daemon served the
	// old store alone: the old store holds only markers, and is retired once every
	// daemon is restarted on the new store alone.
	Done bool
}

// Rate is the keys handed over per second since the copier started.
func (p MoveProgress) Rate(now time.Time) float64 {
	return float64(p.Moved) / max(now.Sub(p.Started).Seconds(), 0.001)
}

// ToGo is about how long the keys left take at Rate; 0 when unknown.
func (p MoveProgress) ToGo(now time.Time) time.Duration {
	r := p.Rate(now)
	if r <= 0 {
		return 0
	}
	return time.Duration(float64(p.Left) / r * float64(time.Second))
}

// CopyAll walks the old store and hands over every key not yet moved, reporting
// progress after each key; restarted, it rescans (keys moved already are not listed).
// Each pass first counts what it has to hand over. It returns once a pass found
// nothing left.
func (m *Migrator) CopyAll(ctx context.Context, progress func(MoveProgress)) (MoveProgress, error) {
	p := MoveProgress{Started: m.now()}
	first := true
	for {
		ok, err := m.markersAllowed(ctx)
		if err != nil {
			return p, err
		}
		if !ok {
			p.Waiting = waitingFor(Census{Unknown: m.lastCensus().Unknown})
			p.AloneDaemons = len(p.Waiting)
			if progress != nil {
				progress(p)
			}
			select {
			case <-ctx.Done():
				return p, ctx.Err()
			case <-time.After(censusEvery):
			}
			continue
		}
		if first {
			// The first pass moves at once: a look that counted what is left would read
			// every record once more. Its Left is the store's own count of its records
			// (Counter), markers included where it counts them (a Redis's DBSIZE).
			first = false
			p.Left, p.Passed = 0, 0
			if c, ok := m.oldStore.(Counter); ok {
				if n, err := c.Records(ctx); err == nil {
					p.Left = n
				}
			}
			if progress != nil {
				progress(p)
			}
			if err := m.copyPass(ctx, &p, progress); err != nil {
				return p, err
			}
			continue
		}
		var left int64
		moved, err := m.old.Unmoved(ctx, func(string, [32]byte, string) error { left++; return nil })
		if err != nil {
			return p, err
		}
		p.Left, p.Passed = left, moved
		if progress != nil {
			progress(p)
		}
		if left == 0 {
			n := 0
			p.Waiting = nil
			if cc, ok := m.oldStore.(ClientCensus); ok {
				c, err := cc.Census(ctx)
				if err != nil {
					return p, err
				}
				n = len(c.Alone) + len(c.Unknown)
				p.Waiting = waitingFor(c)
			} else if dc, ok := m.oldStore.(DaemonCounter); ok {
				if n, err = dc.Daemons(ctx); err != nil {
					return p, err
				}
			}
			if p.AloneDaemons = n; n > 0 {
				// They may still write a record there: pass again later.
				if progress != nil {
					progress(p)
				}
				select {
				case <-ctx.Done():
					return p, ctx.Err()
				case <-time.After(time.Second):
				}
				continue
			}
			p.Done = true
			if progress != nil {
				progress(p)
			}
			return p, nil
		}
		p.Waiting = nil
		if err := m.copyPass(ctx, &p, progress); err != nil {
			return p, err
		}
	}
}

// moveBatchWorkers is how many batches the copier hands over at once: while one
// batch's keys are moved out of the old store, another's are imported into the new
// one, so that both stores and the copier work at the same time.
const moveBatchWorkers = 4

// copyPass hands over every key the old store lists in its batches, each batch in
// three round trips (MoveOut on every key, the imports, ConfirmMoved on every key
// imported), moveBatchWorkers batches at a time, counting them in p and reporting p
// after each key. Each key is handed over in the steps of a call's handover (Move),
// so every guarantee of one handover holds.
func (m *Migrator) copyPass(ctx context.Context, p *MoveProgress, progress func(MoveProgress)) error {
	var mu sync.Mutex
	batches := make(chan []MoveKey)
	var wg sync.WaitGroup
	for range moveBatchWorkers {
		wg.Go(func() {
			for keys := range batches {
				handed, sealed, failed := m.moveBatch(ctx, keys)
				mu.Lock()
				for i := range handed + sealed + failed {
					switch {
					case i < handed:
						p.Moved++
					case i < handed+sealed:
						p.Passed++
					default:
						p.Failed++
					}
					p.Left = max(p.Left-1, 0)
					if progress != nil {
						progress(*p)
					}
				}
				mu.Unlock()
			}
		})
	}
	err := m.old.UnmovedBatches(ctx, func(keys []MoveKey) error {
		select {
		case batches <- append([]MoveKey(nil), keys...):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	close(batches)
	wg.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// moveBatch hands keys over as Move hands each over (MoveOut, a conditional import of
// what it answers, ConfirmMoved), each step for every key at once, and says how many
// were handed over, how many were sealed already (or had no live record, and are
// sealed now), and how many failed: those are left as they were, or moving, for the
// next pass or call to finish.
func (m *Migrator) moveBatch(ctx context.Context, keys []MoveKey) (handed, sealed, failed int) {
	outs := m.old.MoveOutBatch(ctx, keys, true, m.now().Add(MarkerLife))
	records := make([]Exported, 0, len(keys))
	moving := make([]MoveKey, 0, len(keys))
	for i, o := range outs {
		switch {
		case o.Err != nil:
			failed++
		case o.Outcome == MoveSealed:
			sealed++
		default:
			e := *o.Record
			if e.ID.Key == "" {
				e.ID.Key = keys[i].Key
			}
			records = append(records, e)
			moving = append(moving, keys[i])
		}
	}
	if len(records) == 0 {
		return 0, sealed, failed
	}
	imported := ImportAll(ctx, m.nextPort, records)
	confirm := moving[:0]
	for i, r := range imported {
		if r.Err != nil {
			failed++
			continue
		}
		confirm = append(confirm, moving[i])
	}
	if len(confirm) > 0 {
		for _, err := range m.old.ConfirmMovedBatch(ctx, confirm, m.now().Add(MarkerLife)) {
			if err != nil {
				failed++
			} else {
				handed++
			}
		}
	}
	m.handedOver.Add(int64(handed))
	return handed, sealed, failed
}

// waitingFor describes what c keeps a move from, one line each.
func waitingFor(c Census) []string {
	out := make([]string, 0, len(c.Alone)+len(c.Unknown))
	out = append(out, c.Alone...)
	return append(out, c.Unknown...)
}
