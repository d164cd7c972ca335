package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
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

// Usage implements engine.UsageReader. It reads the tenant's usage hash of every slot,
// in pipelines of indexBatch (a Cluster pipeline sends each node its own), counts the
// spans that have not ended by Redis's clock, and deletes those that have: what
// expired records left there. Its cost is one HGETALL for each of the 16384 slots
// (most of them absent) and the spans it reads, whatever the tenant keeps.
func (s *Store) Usage(ctx context.Context, tenant string) (engine.Usage, error) {
	if _, err := s.current(ctx); err != nil {
		return engine.Usage{}, err
	}
	var u engine.Usage
	var nowSpan int64
	var earliest int64
	for first := 0; first < slots; first += indexBatch {
		n := min(indexBatch, slots-first)
		p := s.client.Pipeline()
		var clock *redis.TimeCmd
		if first == 0 {
			clock = p.Time(ctx)
		}
		cmds := make([]*redis.MapStringStringCmd, n)
		for i := range n {
			cmds[i] = p.HGetAll(ctx, usageKey(tenant, uint16(first+i)))
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
				stale.HDel(ctx, usageKey(tenant, uint16(first+i)), gone...)
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
