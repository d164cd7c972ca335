package redisstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The due index lets the abandoned-keys feed read only the slots that may hold a lease
// that ran out, rather than all 16384 pending indexes (indexKey). It is one sorted set
// a tenant (dueKey), whose members are slots and whose scores are, for each slot, at
// most the earliest lease expiry in its pending index:
//
//	for every entry e of a slot's pending index, the slot is in the due index with a
//	score of at most e's
//
// so that the slots scored up to a feed's Before are the only ones that can hold an
// abandoned key. The scripts cannot keep it (it lives in one slot, the indexes in
// all), so the daemons do, around them:
//
//   - Lowering. After a script gives a record a pending entry it did not have (a claim
//     acquires, an import writes a pending record), the daemon adds the slot with the
//     lease's expiry, ZADD LT, which only ever lowers a score (noteDue). Notes go out
//     from a goroutine of their own, many in one command, and the feed sends this
//     daemon's own before it reads. Extending a lease only raises an entry, which keeps
//     the rule.
//   - Raising. A slot's score stays where the earliest lease of its past put it when
//     that record finishes; the feed, on reading a slot that holds no entry up to its
//     Before, raises the slot's score to its earliest entry, or removes the slot when
//     it holds none (raiseDue). Then it reads the slot's earliest entry again and
//     lowers the score to it where a claim came in between: a note the raise wrote
//     over was sent after its script, so that script's entry is there for the second
//     read; a later note lowers the raise itself.
//   - Sweeping. A note can be lost: a daemon killed between a script and its note, a
//     daemon of an earlier release that writes none, entries written before the index
//     was. So the feed reads the earliest entry of every slot and lowers the index to
//     it (sweepDue), once every dueSweepEvery a tenant, at the first pass after that
//     (dueSweptKey, SET NX, says when one last ran). A lost note delays an abandoned
//     key in the feed by that much at most; none is lost.
//
// A pass of the feed thus costs a read of the due index, plus a read of each slot that
// holds an abandoned key (or did, or had a lease run out since the last pass), and, once
// every dueSweepEvery, a sweep: one command for each slot.

// dueKey is a tenant's due index. On a Cluster it lives in one slot: every daemon and
// feed reaches it with one command, never from a script.
func dueKey(tenant string) string { return "\x00pending-due:" + tenant }

// dueSweptKey is set, for dueSweepEvery, when a feed sweeps tenant's pending indexes
// into its due index.
func dueSweptKey(tenant string) string { return "\x00pending-swept:" + tenant }

const (
	// dueSweepEvery bounds how late a key whose note was lost is listed by the feed.
	dueSweepEvery = time.Minute
	// dueTimeout bounds one attempt to send notes.
	dueTimeout = 5 * time.Second
)

// dueNotes are the notes noteDue has taken that Redis has not yet: for each tenant and
// slot, the earliest lease expiry to add, ms.
type dueNotes struct {
	mu      sync.Mutex
	tenants map[string]map[uint16]int64
	running bool
	wake    chan struct{}
}

// put adds notes, keeping the earliest expiry of a slot; a.mu is held.
func (a *dueNotes) put(tenant string, slot uint16, expiry int64) {
	if a.tenants == nil {
		a.tenants = make(map[string]map[uint16]int64)
	}
	m := a.tenants[tenant]
	if m == nil {
		m = make(map[uint16]int64)
		a.tenants[tenant] = m
	}
	if old, ok := m[slot]; !ok || expiry < old {
		m[slot] = expiry
	}
}

// take removes and returns the notes still to send, every tenant's or only tenant's
// when it is set.
func (a *dueNotes) take(tenant string) map[string]map[uint16]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if tenant == "" {
		out := a.tenants
		a.tenants = nil
		return out
	}
	m, ok := a.tenants[tenant]
	if !ok {
		return nil
	}
	delete(a.tenants, tenant)
	return map[string]map[uint16]int64{tenant: m}
}

// giveBack returns notes Redis did not take, for the next attempt.
func (a *dueNotes) giveBack(notes map[string]map[uint16]int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for tenant, m := range notes {
		for slot, expiry := range m {
			a.put(tenant, slot, expiry)
		}
	}
}

// noteDue has slot added to tenant's due index with a lease that expires at expiry, if
// it has none earlier, soon: the call does not wait for Redis (the index lives on one
// master, and a claim on another must not stop when that one does).
func (s *Store) noteDue(tenant string, slot uint16, expiry time.Time) {
	a := &s.dueNotes
	a.mu.Lock()
	defer a.mu.Unlock()
	a.put(tenant, slot, expiry.UnixMilli())
	if a.running {
		select {
		case a.wake <- struct{}{}:
		default:
		}
		return
	}
	s.agreeMu.Lock()
	defer s.agreeMu.Unlock()
	if s.closing.Err() != nil {
		return
	}
	a.running = true
	if a.wake == nil {
		a.wake = make(chan struct{}, 1)
	}
	s.agreeWG.Add(1)
	go s.sendNotes()
}

// sendNotes sends the notes, many in one pipeline, until none is left or the store
// closes; after a failure it tries again, waiting longer each time up to a second.
// ZADD LT is idempotent, and notes of several daemons in any order leave the earliest.
func (s *Store) sendNotes() {
	defer s.agreeWG.Done()
	a := &s.dueNotes
	backoff := 10 * time.Millisecond
	for {
		notes := a.take("")
		if len(notes) == 0 {
			a.mu.Lock()
			if len(a.tenants) == 0 {
				a.running = false
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
			continue
		}
		ctx, cancel := context.WithTimeout(s.closing, dueTimeout)
		err := s.addDue(ctx, notes)
		cancel()
		if err == nil {
			backoff = 10 * time.Millisecond
			continue
		}
		a.giveBack(notes)
		s.reloadOnNetworkError(err)
		select {
		case <-s.closing.Done():
			return
		case <-time.After(backoff):
		case <-a.wake:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// flushDue sends tenant's notes not yet sent, so that a feed reading the due index
// finds every lease this daemon handed out.
func (s *Store) flushDue(ctx context.Context, tenant string) error {
	notes := s.dueNotes.take(tenant)
	if len(notes) == 0 {
		return nil
	}
	if err := s.addDue(ctx, notes); err != nil {
		s.dueNotes.giveBack(notes)
		return s.failed(ctx, err)
	}
	return nil
}

// addDue lowers the due indexes to the notes, one ZADD LT a tenant.
func (s *Store) addDue(ctx context.Context, notes map[string]map[uint16]int64) error {
	p := s.client.Pipeline()
	for tenant, m := range notes {
		members := make([]redis.Z, 0, len(m))
		for slot, expiry := range m {
			members = append(members, redis.Z{Score: float64(expiry), Member: strconv.Itoa(int(slot))})
		}
		p.ZAddLT(ctx, dueKey(tenant), members...)
	}
	_, err := p.Exec(ctx)
	return err
}

// dueSlots returns the slots of tenant's due index scored up to before, having sent
// this daemon's notes, and swept the pending indexes first when no feed has lately.
func (s *Store) dueSlots(ctx context.Context, tenant string, before int64) ([]uint16, error) {
	if err := s.flushDue(ctx, tenant); err != nil {
		return nil, err
	}
	p := s.client.Pipeline()
	sweep := p.SetNX(ctx, dueSweptKey(tenant), "1", dueSweepEvery)
	due := p.ZRangeArgs(ctx, redis.ZRangeArgs{Key: dueKey(tenant), Start: "-inf", Stop: strconv.FormatInt(before, 10), ByScore: true})
	if _, err := p.Exec(ctx); err != nil {
		return nil, s.failed(ctx, err)
	}
	members := due.Val()
	if sweep.Val() {
		if err := s.sweepDue(ctx, tenant); err != nil {
			// The next pass sweeps again.
			s.resweep(ctx, tenant)
			return nil, s.failed(ctx, err)
		}
		var err error
		members, err = s.readDue(ctx, tenant, before)
		if err != nil {
			return nil, err
		}
	}
	out := make([]uint16, 0, len(members))
	for _, m := range members {
		n, err := strconv.ParseUint(m, 10, 16)
		if err != nil || n >= slots {
			continue
		}
		out = append(out, uint16(n))
	}
	return out, nil
}

func (s *Store) readDue(ctx context.Context, tenant string, before int64) ([]string, error) {
	p := s.client.Pipeline()
	due := p.ZRangeArgs(ctx, redis.ZRangeArgs{Key: dueKey(tenant), Start: "-inf", Stop: strconv.FormatInt(before, 10), ByScore: true})
	if _, err := p.Exec(ctx); err != nil {
		return nil, s.failed(ctx, err)
	}
	return due.Val(), nil
}

// earliest reads the earliest entry of each slot's pending index: its score, or
// nothing (ok false) for an empty index.
func (s *Store) earliest(ctx context.Context, tenant string, list []uint16) ([]float64, []bool, error) {
	scores, ok := make([]float64, len(list)), make([]bool, len(list))
	for start := 0; start < len(list); start += indexBatch {
		batch := list[start:min(start+indexBatch, len(list))]
		p := s.client.Pipeline()
		cmds := make([]*redis.ZSliceCmd, len(batch))
		for i, slot := range batch {
			cmds[i] = p.ZRangeWithScores(ctx, indexKey(tenant, slot), 0, 0)
		}
		if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, nil, err
		}
		for i, cmd := range cmds {
			if v := cmd.Val(); len(v) > 0 {
				scores[start+i], ok[start+i] = v[0].Score, true
			}
		}
	}
	return scores, ok, nil
}

// sweepDue lowers tenant's due index to the earliest entry of every slot's pending
// index.
func (s *Store) sweepDue(ctx context.Context, tenant string) error {
	all := make([]uint16, slots)
	for i := range all {
		all[i] = uint16(i)
	}
	scores, ok, err := s.earliest(ctx, tenant, all)
	if err != nil {
		return err
	}
	var members []redis.Z
	for i, found := range ok {
		if found {
			members = append(members, redis.Z{Score: scores[i], Member: strconv.Itoa(i)})
		}
	}
	if len(members) == 0 {
		return nil
	}
	p := s.client.Pipeline()
	p.ZAddLT(ctx, dueKey(tenant), members...)
	_, err = p.Exec(ctx)
	return err
}

// raiseDue raises the scores of slots that the feed found holding no entry up to its
// Before to their earliest entry, or removes them when they hold none, then lowers
// them again where an entry came in meanwhile (see the top of this file). It only
// saves work: a failure leaves a score too low, which costs the next pass a read.
func (s *Store) raiseDue(ctx context.Context, tenant string, list []uint16) {
	if len(list) == 0 {
		return
	}
	scores, ok, err := s.earliest(ctx, tenant, list)
	if err != nil {
		return
	}
	p := s.client.Pipeline()
	for i, slot := range list {
		if ok[i] {
			p.ZAddGT(ctx, dueKey(tenant), redis.Z{Score: scores[i], Member: strconv.Itoa(int(slot))})
		} else {
			p.ZRem(ctx, dueKey(tenant), strconv.Itoa(int(slot)))
		}
	}
	if _, err := p.Exec(ctx); err != nil {
		return
	}
	again, okAgain, err := s.earliest(ctx, tenant, list)
	if err != nil {
		// The raise may have gone over an entry this read would have found: sweep at the
		// next pass.
		s.resweep(ctx, tenant)
		return
	}
	var lower []redis.Z
	for i, slot := range list {
		if okAgain[i] && (!ok[i] || again[i] < scores[i]) {
			lower = append(lower, redis.Z{Score: again[i], Member: strconv.Itoa(int(slot))})
		}
	}
	if len(lower) > 0 {
		p := s.client.Pipeline()
		p.ZAddLT(ctx, dueKey(tenant), lower...)
		if _, err := p.Exec(ctx); err != nil {
			s.resweep(ctx, tenant)
		}
	}
}

// resweep has the next pass of the feed sweep, after a failure that may have left the
// due index short of a slot. Should this fail too, the sweep comes within
// dueSweepEvery.
func (s *Store) resweep(ctx context.Context, tenant string) {
	p := s.client.Pipeline()
	p.Del(ctx, dueSweptKey(tenant))
	_, _ = p.Exec(ctx)
}
