package redisstore

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Queued is how many calls wait for a pipeline, for tests that arrange a batch.
func (s *Store) Queued() int { return s.pipe.queued() }

// Lanes is how many masters have a lane of pipelines.
func (s *Store) Lanes() int { return s.pipe.lanesOpen() }

// SetLaneIdle sets how long an unused lane stays; call it before the store's first call.
func (s *Store) SetLaneIdle(d time.Duration) { s.pipe.laneIdle = d }

// SetScanBudget sets how long a store with LayoutAuto looks for records on each
// master; call it before the store's first call.
func (s *Store) SetScanBudget(d time.Duration) { s.scanBudget = d }

// OpenWithScripts is OpenWith running the scripts in dir (prelude.lua, then each
// transition's file, as lua.Source joins them) instead of this release's: the scripts
// of an earlier release, for tests of daemons of two releases sharing a Redis.
func OpenWithScripts(rawURL string, opts Options, dir string) (*Store, error) {
	s, err := OpenWith(rawURL, opts)
	if err != nil {
		return nil, err
	}
	prelude, err := os.ReadFile(filepath.Join(dir, "prelude.lua"))
	if err != nil {
		return nil, err
	}
	read := func(transition string, writes bool) (script, error) {
		body, err := os.ReadFile(filepath.Join(dir, transition+".lua"))
		if errors.Is(err, fs.ErrNotExist) && transition == "mark" {
			// Releases before recovery points have no such script, nor a route to it.
			return script{}, nil
		}
		if err != nil {
			return script{}, err
		}
		src, shebang := string(body), ""
		if strings.HasPrefix(src, "#!") {
			nl := strings.IndexByte(src, '\n')
			shebang, src = src[:nl+1], src[nl+1:]
		}
		return script{redis.NewScript(shebang + string(prelude) + "\n" + src), writes}, nil
	}
	var set scripts
	for _, x := range []struct {
		s      *script
		name   string
		writes bool
	}{
		{&set.claim, "claim", true}, {&set.complete, "complete", true}, {&set.release, "release", true},
		{&set.extend, "extend", true}, {&set.lookup, "lookup", false}, {&set.purge, "purge", true},
		{&set.mark, "mark", true}, {&set.watch, "watch", true},
	} {
		if *x.s, err = read(x.name, x.writes); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	s.layout.Store(&layoutState{layout: layoutOf(opts), scripts: &set, lean: opts.LeanReady || opts.LeanRecords})
	return s, nil
}

// InfoField is infoField, for tests that read INFO.
var InfoField = infoField

// UsageSlotsKey is the key of the bitmap of slots where the release before this one
// counted a tenant's usage on a Cluster.
func UsageSlotsKey(tenant string) string { return usageSlotsKey(tenant) }

// UsageTotalsKey is the key of a tenant's usage totals.
func UsageTotalsKey(tenant string) string { return usageTotalsKey(tenant) }

// UsageKey is the usage hash the release before this one kept of a tenant in a slot.
func UsageKey(tenant string, slot uint16) string { return usageKey(tenant, slot) }

// SendUsage sends what the store's scripts counted to the tenants' totals now, as it
// does by itself within usageFlushEvery.
func (s *Store) SendUsage(ctx context.Context) error {
	if s.sendUsage(ctx, s.usage.takeToSend()) {
		return errors.New("some counts could not be sent")
	}
	return nil
}

// CountUsage counts records and bytes expiring at expires in tenant's usage, as a
// script's answer would, to be sent with the store's other counts.
func (s *Store) CountUsage(tenant string, expires time.Time, records, bytes int64) {
	span := (expires.UnixMilli() + usageSpan.Milliseconds() - 1) / usageSpan.Milliseconds()
	s.count(tenant, []any{span, records, bytes})
}

// UsageSpan is the span of usage.lua, and UsageByte its BYTE.
const (
	UsageSpan = usageSpan
	UsageByte = usageByte
)
