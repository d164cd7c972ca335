package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// usageSpan and usageByte are the SPAN and BYTE of usage.lua: a tenant's totals count
// records by the span their expiry falls in, each span as bytes * usageByte + records,
// and a record that expired counts until its span ends.
const (
	usageSpan = 10 * time.Second
	usageByte = 1 << 24
)

// usageTotalsKey is the hash of a tenant's usage totals and its spans (usage.lua), and
// usageEndsKey the sorted set of those spans, both in the slot of the tenant's name, so
// that one script reads and writes both on a Cluster. The NUL first keeps them apart
// from every record key.
func usageTotalsKey(tenant string) string { return "\x00usage-totals:{" + tenant + "}" }
func usageEndsKey(tenant string) string   { return "\x00usage-ends:{" + tenant + "}" }

// usageKey is the usage hash of a tenant's records in one Cluster slot, as the
// release before this one counted them in its scripts; only foldEarlier reads it now.
func usageKey(tenant string, slot uint16) string {
	tag := slotTags[slot]
	return "{" + string(tag[:]) + "}\x00usage:" + tenant
}

// soleUsageKey is the one usage hash of a tenant of the release before this one where
// Redis has one master and no slots (standalone or Sentinel); usage.lua folds it in.
func soleUsageKey(tenant string) string { return "\x00usage:" + tenant }

// usageSlotsKey is, on a Cluster, the bitmap of the slots where the release before this
// one may have counted a tenant's usage (bit n, SETBIT's offset, for slot n): the slots
// foldEarlier has to read.
func usageSlotsKey(tenant string) string { return "\x00usage-slots:" + tenant }

// The places the release before this one kept usage, decided once from what Redis says
// of itself.
const (
	usageUndecided int32 = iota
	usagePerSlot
	usageSole
)

// usageFlushEvery is how often a daemon sends what its scripts counted to the tenants'
// totals (sendUsage), while it has something to send: what one daemon wrote shows in
// another's reads this much later at most, when Redis answers. A daemon's own reads
// send first, and so count every write it answered.
const usageFlushEvery = 100 * time.Millisecond

// usageTimeout bounds one sending of counts, and the last one at Close.
const usageTimeout = 5 * time.Second

//go:embed usage.lua
var usageSource string

//go:embed usagefold.lua
var usageFoldSource string

// usage.lua runs in two forms: usageScript writes, usageReadScript (READONLY) only
// reads, for a Redis out of memory.
var (
	usageScript     = redis.NewScript("local READONLY = false\n" + usageSource)
	usageReadScript = redis.NewScript("#!lua flags=no-writes\nlocal READONLY = true\n" + usageSource)
	usageFoldScript = redis.NewScript(usageFoldSource)
)

// spanCount is what a span of a tenant's usage moved by: records and bytes.
type spanCount [2]int64

// usageCounts are the counts a daemon's scripts answered and it has not yet sent to the
// tenants' totals, by tenant and span, and the earlier release's slots still to fold.
type usageCounts struct {
	mu      sync.Mutex
	tenants map[string]map[int64]spanCount
	// earlier holds, by tenant, slots foldEarlier took from the bitmap and could not read.
	earlier map[string][]uint16
	// sending holds, by tenant, a channel closed once the counts being sent have gone
	// (or are back in tenants): a read of the tenant waits for it, so that it counts them.
	sending map[string]chan struct{}
	// flights are, by tenant, the writes whose scripts are under way (writing).
	flights map[string]*flights
	running bool
}

// flights are a tenant's writes under way, by the epoch they began in: each read
// begins an epoch, and waits for the writes of the epochs before to answer, so that it
// counts a write whose script Redis ran before the read's, as a count kept in Redis
// would.
type flights struct {
	epoch int
	open  map[int]int
	waits map[int]chan struct{}
}

// usageWriteWait bounds how long a read waits for the writes under way when it began.
const usageWriteWait = time.Second

// writing notes a write of tenant under way, and returns the epoch to hand to wrote.
func (c *usageCounts) writing(tenant string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flights == nil {
		c.flights = make(map[string]*flights)
	}
	f := c.flights[tenant]
	if f == nil {
		f = &flights{open: make(map[int]int), waits: make(map[int]chan struct{})}
		c.flights[tenant] = f
	}
	f.open[f.epoch]++
	return f.epoch
}

// wrote notes that a write that began in epoch has answered, its count taken.
func (c *usageCounts) wrote(tenant string, epoch int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.flights[tenant]
	if f == nil {
		return
	}
	if f.open[epoch]--; f.open[epoch] > 0 {
		return
	}
	delete(f.open, epoch)
	if ch := f.waits[epoch]; ch != nil {
		close(ch)
		delete(f.waits, epoch)
	}
	if len(f.open) == 0 {
		delete(c.flights, tenant)
	}
}

// underWay begins an epoch of tenant's writes and returns the channels that close as
// the writes under way until now answer.
func (c *usageCounts) underWay(tenant string) []chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.flights[tenant]
	if f == nil {
		return nil
	}
	var chans []chan struct{}
	for epoch := range f.open {
		ch := f.waits[epoch]
		if ch == nil {
			ch = make(chan struct{})
			f.waits[epoch] = ch
		}
		chans = append(chans, ch)
	}
	f.epoch++
	return chans
}

// count adds what a script answered it moved in tenant's usage (lua/prelude.lua's
// ACCT: triples of span, records, bytes) to what the daemon has to send, and has it
// sent within usageFlushEvery.
func (s *Store) count(tenant string, acct any) {
	list, ok := acct.([]any)
	if !ok || len(list) < 3 {
		return
	}
	c := &s.usage
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tenants == nil {
		c.tenants = make(map[string]map[int64]spanCount)
	}
	spans := c.tenants[tenant]
	if spans == nil {
		spans = make(map[int64]spanCount)
		c.tenants[tenant] = spans
	}
	for i := 0; i+2 < len(list); i += 3 {
		span := integer(list[i])
		n := spans[span]
		n[0] += integer(list[i+1])
		n[1] += integer(list[i+2])
		spans[span] = n
	}
	if c.running {
		return
	}
	s.agreeMu.Lock()
	defer s.agreeMu.Unlock()
	if s.closing.Err() != nil {
		// Close sends what is left.
		return
	}
	c.running = true
	s.agreeWG.Add(1)
	go s.flushUsage()
}

// take returns what is still to send of tenant, or of every tenant when tenant is "",
// and forgets it.
func (c *usageCounts) take(tenant string) map[string]map[int64]spanCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[int64]spanCount)
	for name, spans := range c.tenants {
		if tenant == "" || name == tenant {
			out[name] = spans
			delete(c.tenants, name)
		}
	}
	return out
}

// takeToSend is take("") for sendUsage, which says when each tenant's are sent (sent).
func (c *usageCounts) takeToSend() map[string]map[int64]spanCount {
	out := c.take("")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sending == nil {
		c.sending = make(map[string]chan struct{})
	}
	for name := range out {
		if c.sending[name] == nil {
			c.sending[name] = make(chan struct{})
		}
	}
	return out
}

// sent says that tenant's counts taken to send have gone, or are back to send.
func (c *usageCounts) sent(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch := c.sending[tenant]; ch != nil {
		close(ch)
		delete(c.sending, tenant)
	}
}

// inFlight returns the channel that closes once tenant's counts being sent are sent,
// or nil when none are.
func (c *usageCounts) inFlight(tenant string) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sending[tenant]
}

// putBack returns counts that could not be sent to what is to send.
func (c *usageCounts) putBack(tenant string, spans map[int64]spanCount) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tenants == nil {
		c.tenants = make(map[string]map[int64]spanCount)
	}
	mine := c.tenants[tenant]
	if mine == nil {
		c.tenants[tenant] = spans
		return
	}
	for span, n := range spans {
		m := mine[span]
		mine[span] = spanCount{m[0] + n[0], m[1] + n[1]}
	}
}

// flushUsage sends what the daemon counted, every usageFlushEvery, until nothing is
// left or the store closes (Close sends the rest). A sending that fails is tried again
// at the next, waiting longer each time up to a second.
func (s *Store) flushUsage() {
	defer s.agreeWG.Done()
	c := &s.usage
	wait := usageFlushEvery
	for {
		select {
		case <-s.closing.Done():
			c.mu.Lock()
			c.running = false
			c.mu.Unlock()
			return
		case <-time.After(wait):
		}
		ctx, cancel := context.WithTimeout(s.closing, usageTimeout)
		failed := s.sendUsage(ctx, c.takeToSend())
		cancel()
		if failed {
			wait = min(2*wait, time.Second)
		} else {
			wait = usageFlushEvery
		}
		c.mu.Lock()
		if len(c.tenants) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// sendUsage sends counts to their tenants' totals, one script a tenant, and keeps what
// could not be sent; it says whether any could not.
func (s *Store) sendUsage(ctx context.Context, counts map[string]map[int64]spanCount) bool {
	failed := false
	for tenant, spans := range counts {
		_, sent, err := s.runUsage(ctx, tenant, spans, false)
		if !sent {
			s.usage.putBack(tenant, spans)
			failed = true
		}
		s.usage.sent(tenant)
		if err != nil {
			s.reloadOnNetworkError(err)
		}
	}
	return failed
}

// runUsage runs usage.lua for tenant with spans to add, and answers its totals and
// whether it added spans. With sole, the earlier release's one usage hash of the tenant
// is folded in too. A Redis out of memory refuses the script, which writes: the totals
// are then read without writing, spans added to them here and not sent.
func (s *Store) runUsage(ctx context.Context, tenant string, spans map[int64]spanCount, sole bool) (engine.Usage, bool, error) {
	keys := []string{usageTotalsKey(tenant), usageEndsKey(tenant)}
	if sole {
		keys = append(keys, soleUsageKey(tenant))
	}
	args := make([]any, 0, 3*len(spans))
	for span, n := range spans {
		if n != (spanCount{}) {
			args = append(args, span, n[0], n[1])
		}
	}
	v, err := usageScript.Run(ctx, s.client, keys, args...).Slice()
	sent := err == nil
	if isOOM(err) {
		v, err = usageReadScript.Run(ctx, s.client, keys[:2]).Slice()
	}
	if err != nil {
		return engine.Usage{}, false, err
	}
	if len(v) != 3 {
		return engine.Usage{}, sent, fmt.Errorf("malformed usage answer %v", v)
	}
	u := engine.Usage{Records: integer(v[0]), Bytes: integer(v[1])}
	if !sent {
		for _, n := range spans {
			u.Records += n[0]
			u.Bytes += n[1]
		}
	}
	// Counts lost to a daemon that died, or not yet sent by another, may take a span
	// below nothing until it ends; the usage does not go below nothing.
	u.Records, u.Bytes = max(u.Records, 0), max(u.Bytes, 0)
	if first := integer(v[2]); first > 0 {
		u.NextDrop = time.UnixMilli(first * usageSpan.Milliseconds()).Add(time.Millisecond)
	}
	return u, sent, nil
}

// isOOM says whether err is Redis refusing a write for want of memory.
func isOOM(err error) bool {
	if err == nil {
		return false
	}
	var answered redis.Error
	return errors.As(err, &answered) && strings.HasPrefix(answered.Error(), "OOM ")
}

// scriptKeys are the keys of a script on a record of tenant whose key's SHA-256 is sum:
// its two keys and its slot's pending index (lua/prelude.lua).
func scriptKeys(tenant string, sum [32]byte) []string { return digestKeys(tenant, sum)[:3] }

// soleUsage tells whether Redis has one master and no slots, where the release before
// this one kept each tenant's usage in one hash (soleUsageKey), rather than in a hash
// for each slot (usageKey). It asks INFO once per store.
func (s *Store) soleUsage(ctx context.Context) (bool, error) {
	switch s.usagePlace.Load() {
	case usagePerSlot:
		return false, nil
	case usageSole:
		return true, nil
	}
	m, err := s.client.MasterFor(ctx, usageSlotsKey(""))
	if err != nil {
		return false, err
	}
	info, err := m.Info(ctx, "cluster").Result()
	if err != nil {
		return false, err
	}
	if infoField(info, "cluster_enabled") == 1 {
		s.usagePlace.Store(usagePerSlot)
		return false, nil
	}
	s.usagePlace.Store(usageSole)
	return true, nil
}

// foldEarlier takes, on a Cluster, the slots where daemons of the release before this
// one counted tenant's usage since the last fold (their bitmap), and the usage hashes
// of those slots, deleting each (usagefold.lua), and adds their spans to spans. Where
// no daemon of that release runs, it is one small script on a key that is not there.
// A slot whose hash could not be read is kept for the next read.
func (s *Store) foldEarlier(ctx context.Context, tenant string, spans map[int64]spanCount) error {
	bitmap, err := usageFoldScript.Run(ctx, s.client, []string{usageSlotsKey(tenant)}).Text()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	c := &s.usage
	c.mu.Lock()
	slotList := c.earlier[tenant]
	delete(c.earlier, tenant)
	c.mu.Unlock()
	// SETBIT's offset 0 is the highest bit of the first byte.
	for i, b := range []byte(bitmap) {
		for bit := range 8 {
			if n := i*8 + bit; b&(0x80>>bit) != 0 && n < slots {
				slotList = append(slotList, uint16(n))
			}
		}
	}
	var left []uint16
	for _, slot := range slotList {
		v, err := usageFoldScript.Run(ctx, s.client, []string{usageKey(tenant, slot)}).StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			left = append(left, slot)
			continue
		}
		for i := 0; i+1 < len(v); i += 2 {
			span, err1 := strconv.ParseInt(v[i], 10, 64)
			x, err2 := strconv.ParseInt(v[i+1], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			records := ((x % usageByte) + usageByte) % usageByte
			if records >= usageByte/2 {
				records -= usageByte
			}
			n := spans[span]
			spans[span] = spanCount{n[0] + records, n[1] + (x-records)/usageByte}
		}
	}
	if len(left) > 0 {
		c.mu.Lock()
		if c.earlier == nil {
			c.earlier = make(map[string][]uint16)
		}
		c.earlier[tenant] = append(c.earlier[tenant], left...)
		c.mu.Unlock()
	}
	return nil
}

// Usage implements engine.UsageReader: one script on the tenant's totals (usage.lua),
// which first adds what this daemon counted and has not sent yet (after a sending of
// the tenant's under way, if one is), so that a read counts every write of the daemon
// that reads, and drops the spans that have ended. On a Cluster a small script goes
// before it, for what daemons of the release before this one counted (foldEarlier).
// So a read costs two commands at most, whatever the tenant keeps, wherever it keeps
// it, and however many daemons write for it.
func (s *Store) Usage(ctx context.Context, tenant string) (engine.Usage, error) {
	if _, err := s.current(ctx); err != nil {
		return engine.Usage{}, err
	}
	sole, err := s.soleUsage(ctx)
	if err != nil {
		return engine.Usage{}, s.failed(ctx, err)
	}
	// Writes under way when the read began answer first, for as long as usageWriteWait
	// (a master that stops answering holds its own writes, not the read), then counts
	// this daemon is sending right now go first, or come back to be sent here.
	if chans := s.usage.underWay(tenant); len(chans) > 0 {
		limit := time.NewTimer(usageWriteWait)
		for _, ch := range chans {
			select {
			case <-ch:
				continue
			case <-limit.C:
			case <-ctx.Done():
				limit.Stop()
				return engine.Usage{}, fmt.Errorf("redis: %w", ctx.Err())
			}
			break
		}
		limit.Stop()
	}
	if ch := s.usage.inFlight(tenant); ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return engine.Usage{}, fmt.Errorf("redis: %w", ctx.Err())
		}
	}
	spans := s.usage.take(tenant)[tenant]
	if spans == nil {
		spans = make(map[int64]spanCount)
	}
	if !sole {
		if err := s.foldEarlier(ctx, tenant, spans); err != nil {
			s.usage.putBack(tenant, spans)
			return engine.Usage{}, s.failed(ctx, err)
		}
	}
	u, sent, err := s.runUsage(ctx, tenant, spans, sole)
	if !sent {
		s.usage.putBack(tenant, spans)
	}
	if err != nil {
		return engine.Usage{}, s.failed(ctx, err)
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
