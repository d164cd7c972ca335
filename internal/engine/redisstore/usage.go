package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// usageSpan and usageByte are USAGE_SPAN_MS and USAGE_BYTE of lua/prelude.lua: the
// usage hashes count records by the span their expiry falls in, each span as bytes *
// usageByte + records, and a record that expired counts until its span ends.
const (
	usageSpan = 10 * time.Second
	usageByte = 1 << 24
)

// usageKey is the usage hash of a tenant's records in one Cluster slot (see
// lua/prelude.lua), beside its pending index, kept per slot for the same reason: a
// script reaches no other slot.
func usageKey(tenant string, slot uint16) string {
	tag := slotTags[slot]
	return "{" + string(tag[:]) + "}\x00usage:" + tenant
}

// soleUsageKey is the one usage hash of a tenant where Redis has one master and no
// slots (standalone or Sentinel): every script reaches it.
func soleUsageKey(tenant string) string { return "\x00usage:" + tenant }

// usageSlotsKey is, on a Cluster, the set of the slots where a tenant may have usage:
// every slot whose usage hash a script may have written, and perhaps more. It is a
// bitmap of 16384 bits, bit n (SETBIT's offset) for slot n: 2 KiB at most, read whole
// by one GET.
func usageSlotsKey(tenant string) string { return "\x00usage-slots:" + tenant }

// The places a store keeps usage, decided once from what Redis says of itself.
const (
	usageUndecided int32 = iota
	usagePerSlot
	usageSole
)

// usageSlotsFresh is how long a daemon trusts its own note that a slot is in a
// tenant's set of slots with usage, before adding it again at the next write there:
// it bounds how long a set that lost a member (a failover that lost a write, a key
// deleted by hand) can leave out a slot written since.
const usageSlotsFresh = 5 * time.Minute

// usageSlotsTimeout bounds one attempt to add slots to the sets of slots with usage.
const usageSlotsTimeout = 5 * time.Second

// slotNotes are the slots a daemon has added to one tenant's set of slots with usage
// since when.
type slotNotes struct {
	since time.Time
	bits  [slots / 64]atomic.Uint64
}

func (n *slotNotes) has(slot uint16) bool { return n.bits[slot/64].Load()&(1<<(slot%64)) != 0 }
func (n *slotNotes) add(slot uint16)      { n.bits[slot/64].Or(1 << (slot % 64)) }

// soleUsage tells whether the store keeps each tenant's usage in one hash: when Redis
// has one master and no slots. Every daemon sharing a store asks the same Redis, so
// all agree; a Redis with Cluster enabled counts per slot, even with one master, so
// that the scripts never need to reach another slot. It asks INFO once per store.
func (s *Store) soleUsage(ctx context.Context) (bool, error) {
	switch s.usagePlace.Load() {
	case usagePerSlot:
		return false, nil
	case usageSole:
		return true, nil
	}
	m, err := s.client.MasterFor(ctx, usageSlotsKey(""))
	if err != nil {
		return false, s.failed(ctx, err)
	}
	info, err := m.Info(ctx, "cluster").Result()
	if err != nil {
		return false, s.failed(ctx, err)
	}
	if infoField(info, "cluster_enabled") == 1 {
		s.usagePlace.Store(usagePerSlot)
		return false, nil
	}
	s.usagePlace.Store(usageSole)
	return true, nil
}

// scriptKeys are the keys of a script on a record of tenant whose key's SHA-256 is
// sum, with the tenant's usage where the store keeps it. On a Cluster, a script that
// writes has its record's slot added to the tenant's set of slots with usage, if this
// daemon has not added it lately (noteSlot): sent beside the script, never waited for.
func (s *Store) scriptKeys(ctx context.Context, tenant string, sum [32]byte, writes bool) ([]string, error) {
	keys := digestKeys(tenant, sum)
	sole, err := s.soleUsage(ctx)
	if err != nil {
		return nil, err
	}
	if sole {
		keys[3] = soleUsageKey(tenant)
		return keys, nil
	}
	if writes {
		s.noteSlot(tenant, slot(keys[0]))
	}
	return keys, nil
}

// notes returns the slots this daemon has added to tenant's set of slots with usage
// within usageSlotsFresh, starting afresh when they are older.
func (s *Store) notes(tenant string) *slotNotes {
	v, _ := s.usageSlots.Load(tenant)
	n, _ := v.(*slotNotes)
	if n == nil || time.Since(n.since) > usageSlotsFresh {
		fresh := &slotNotes{since: time.Now()}
		if n == nil {
			v, _ = s.usageSlots.LoadOrStore(tenant, fresh)
		} else if s.usageSlots.CompareAndSwap(tenant, n, fresh) {
			v = fresh
		} else {
			v, _ = s.usageSlots.Load(tenant)
		}
		n = v.(*slotNotes)
	}
	return n
}

// noteSlot has slot added to tenant's set of slots with usage, unless this daemon did
// so within usageSlotsFresh. The SETBIT goes out from a goroutine of its own (addSlots),
// beside the write that needs it, and the write does not wait for it: the set lives on
// one master, and a write on any other must not stop when that one does. Until Redis
// takes it, the slot stays in slotsToAdd: addSlots tries again, and this daemon's own
// usage reads send it first.
func (s *Store) noteSlot(tenant string, slot uint16) {
	if s.notes(tenant).has(slot) {
		return
	}
	a := &s.slotsToAdd
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tenants == nil {
		a.tenants = make(map[string]map[uint16]bool)
	}
	if a.tenants[tenant] == nil {
		a.tenants[tenant] = make(map[uint16]bool)
	}
	a.tenants[tenant][slot] = true
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
	go s.addSlots()
}

// slotsToAdd are the slots noteSlot was asked to add to tenants' sets of slots with
// usage that Redis has not yet taken.
type slotsToAdd struct {
	mu      sync.Mutex
	tenants map[string]map[uint16]bool
	running bool
	wake    chan struct{}
}

// take returns the slots still to add, every tenant's or only tenant's when it is set.
func (a *slotsToAdd) take(tenant string) map[string][]uint16 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string][]uint16)
	for name, slots := range a.tenants {
		if tenant != "" && name != tenant {
			continue
		}
		for slot := range slots {
			out[name] = append(out[name], slot)
		}
	}
	return out
}

// added records that Redis took the slots: they leave slotsToAdd for the daemon's notes.
func (s *Store) added(slots map[string][]uint16) {
	a := &s.slotsToAdd
	a.mu.Lock()
	defer a.mu.Unlock()
	for tenant, list := range slots {
		n := s.notes(tenant)
		for _, slot := range list {
			n.add(slot)
			delete(a.tenants[tenant], slot)
		}
		if len(a.tenants[tenant]) == 0 {
			delete(a.tenants, tenant)
		}
	}
}

// addSlots sends the slots still to add, in one pipeline, until none is left or the
// store closes; after a failure it tries again, waiting longer each time up to a
// second. SETBIT to 1 is idempotent: daemons adding the same slot at once, or a
// usage read adding it too, leave it set.
func (s *Store) addSlots() {
	defer s.agreeWG.Done()
	a := &s.slotsToAdd
	backoff := 10 * time.Millisecond
	for {
		slots := a.take("")
		if len(slots) == 0 {
			a.mu.Lock()
			if len(a.tenants) == 0 {
				a.running = false
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
			continue
		}
		ctx, cancel := context.WithTimeout(s.closing, usageSlotsTimeout)
		p := s.client.Pipeline()
		for tenant, list := range slots {
			for _, slot := range list {
				p.SetBit(ctx, usageSlotsKey(tenant), int64(slot), 1)
			}
		}
		_, err := p.Exec(ctx)
		cancel()
		if err == nil {
			s.added(slots)
			backoff = 10 * time.Millisecond
			continue
		}
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

// Usage implements engine.UsageReader. On one master it reads the tenant's one usage
// hash; on a Cluster, the hashes of the slots in the tenant's set of slots with usage
// (one GET), in pipelines of indexBatch (a Cluster pipeline sends each node its own).
// It counts the spans that have not ended by Redis's clock, and deletes those that
// have: what expired records left there.
//
// The set is never made smaller: a slot whose hash is empty now may be written at
// any moment by a daemon that added the slot long ago, and would then be left out.
// So a tenant costs as many HGETALLs as the slots it has ever written, at most 16384.
func (s *Store) Usage(ctx context.Context, tenant string) (engine.Usage, error) {
	if _, err := s.current(ctx); err != nil {
		return engine.Usage{}, err
	}
	sole, err := s.soleUsage(ctx)
	if err != nil {
		return engine.Usage{}, err
	}
	var keys []string
	if sole {
		keys = []string{soleUsageKey(tenant)}
	} else {
		// The slots this daemon's writes have counted in and the set may not hold yet
		// go first, on the set's own master: a read here counts every write this
		// daemon answered.
		toAdd := s.slotsToAdd.take(tenant)
		p := s.client.Pipeline()
		for _, slot := range toAdd[tenant] {
			p.SetBit(ctx, usageSlotsKey(tenant), int64(slot), 1)
		}
		cmd := p.Get(ctx, usageSlotsKey(tenant))
		if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return engine.Usage{}, s.failed(ctx, err)
		}
		s.added(toAdd)
		// SETBIT's offset 0 is the highest bit of the first byte.
		for i, b := range []byte(cmd.Val()) {
			for bit := range 8 {
				if n := i*8 + bit; b&(0x80>>bit) != 0 && n < slots {
					keys = append(keys, usageKey(tenant, uint16(n)))
				}
			}
		}
	}
	var u engine.Usage
	var nowSpan int64
	var earliest int64
	for first := 0; first == 0 || first < len(keys); first += indexBatch {
		batch := keys[first:min(first+indexBatch, len(keys))]
		p := s.client.Pipeline()
		var clock *redis.TimeCmd
		if first == 0 {
			clock = p.Time(ctx)
		}
		cmds := make([]*redis.MapStringStringCmd, len(batch))
		for i, key := range batch {
			cmds[i] = p.HGetAll(ctx, key)
		}
		if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return engine.Usage{}, s.failed(ctx, err)
		}
		if clock != nil {
			now := clock.Val().UnixMilli()
			// A span k holds expiries up to k*usageSpan: it still counts while that has
			// not passed.
			nowSpan = (now + usageSpan.Milliseconds() - 1) / usageSpan.Milliseconds()
		}
		stale := s.client.Pipeline()
		dropped := 0
		for i, cmd := range cmds {
			var gone []string
			for field, v := range cmd.Val() {
				span, err1 := strconv.ParseInt(field, 10, 64)
				x, err2 := strconv.ParseInt(v, 10, 64)
				if err1 != nil || err2 != nil {
					continue
				}
				if span < nowSpan {
					gone = append(gone, field)
					continue
				}
				// Floor division, so that a span that took away more than it was given
				// (see the end) still reads as its bytes and records.
				records := ((x % usageByte) + usageByte) % usageByte
				u.Records += records
				u.Bytes += (x - records) / usageByte
				if records > 0 && (earliest == 0 || span < earliest) {
					earliest = span
				}
			}
			if len(gone) > 0 {
				stale.HDel(ctx, batch[i], gone...)
				dropped++
			}
		}
		if dropped > 0 {
			// A span that has ended never counts again, and no script writes to one (a
			// record's span never ends before it expires), so deleting it loses
			// nothing; one left behind costs memory until the next read.
			_, _ = stale.Exec(ctx)
		}
	}
	// Records written before a daemon counted them, then rewritten by one that does,
	// take away what was never added; the count does not go below nothing.
	u.Records, u.Bytes = max(u.Records, 0), max(u.Bytes, 0)
	if earliest > 0 {
		u.NextDrop = time.UnixMilli(earliest * usageSpan.Milliseconds()).Add(time.Millisecond)
	}
	return u, nil
}

// Fill implements engine.FillReader: the fullest master's used_memory against its
// maxmemory, from INFO memory on every master. A master without maxmemory has no
// limit to fill, and counts as empty.
func (s *Store) Fill(ctx context.Context) (engine.Fill, error) {
	var mu sync.Mutex
	var fullest engine.Fill
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		f := engine.Fill{Used: infoField(info, "used_memory"), Limit: infoField(info, "maxmemory")}
		mu.Lock()
		defer mu.Unlock()
		if f.Limit > 0 && (fullest.Limit == 0 || f.Ratio() > fullest.Ratio()) {
			fullest = f
		}
		return nil
	})
	if err != nil {
		return engine.Fill{}, s.failed(ctx, err)
	}
	return fullest, nil
}

// infoField is the integer field name of an INFO answer, 0 when absent.
func infoField(info, name string) int64 {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
