package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// Layout names how a store keeps records in Redis, as --redis-record-layout does. The
// layouts after LayoutAuto are the steps of the move to the lean layout
// (docs/upgrading.md, "Upgrading"), in order: a daemon runs safely beside daemons of
// its own step and of the steps next to it, and nowhere else.
type Layout string

const (
	// LayoutAuto takes the layout that the layout key (LayoutKey) names or, where it
	// names none, the one that what the Redis holds allows (see Store.AgreeLayout).
	LayoutAuto Layout = "auto"
	// LayoutHashes writes hashes, the layout of the releases before the previous one.
	LayoutHashes Layout = "hashes"
	// LayoutStrings writes strings at the keys of earlier releases, as the previous
	// release does, which reads nothing else.
	LayoutStrings Layout = "strings"
	// LayoutLeanReady writes strings and reads lean records too.
	LayoutLeanReady Layout = "lean-ready"
	// LayoutLean writes lean records and reads both.
	LayoutLean Layout = "lean"
	// LayoutLeanOnly writes and reads lean records only.
	LayoutLeanOnly Layout = "lean-only"
)

// layoutSteps are the layouts in the order of the upgrade's steps.
var layoutSteps = []Layout{LayoutHashes, LayoutStrings, LayoutLeanReady, LayoutLean, LayoutLeanOnly}

// ParseLayout reads the name of a layout.
func ParseLayout(name string) (Layout, error) {
	if l := Layout(name); l == LayoutAuto || l.step() >= 0 {
		return l, nil
	}
	return "", fmt.Errorf("record layout %q: auto, strings, lean-ready, lean, lean-only or hashes", name)
}

// step is the layout's place among the upgrade's steps; -1 for LayoutAuto and for a
// name this release does not know, which a later release may write in the layout key.
func (l Layout) step() int { return slices.Index(layoutSteps, l) }

// beside says whether daemons of layouts a and b see each other's records: the same
// step of the upgrade, or steps next to each other.
func beside(a, b Layout) bool {
	return a.step() >= 0 && b.step() >= 0 && a.step()-b.step() <= 1 && b.step()-a.step() <= 1
}

// options are opts with the fields of the layout l.
func (l Layout) options(opts Options) Options {
	opts.HashRecords, opts.LeanReady, opts.LeanRecords, opts.LeanOnly = false, false, false, false
	switch l {
	case LayoutHashes:
		opts.HashRecords = true
	case LayoutLeanReady:
		opts.LeanReady = true
	case LayoutLean:
		opts.LeanRecords = true
	case LayoutLeanOnly:
		opts.LeanRecords, opts.LeanOnly = true, true
	}
	return opts
}

// layoutOf is the layout that the fields of opts describe.
func layoutOf(opts Options) Layout {
	switch {
	case opts.HashRecords:
		return LayoutHashes
	case opts.LeanRecords && opts.LeanOnly:
		return LayoutLeanOnly
	case opts.LeanRecords:
		return LayoutLean
	case opts.LeanReady:
		return LayoutLeanReady
	}
	return LayoutStrings
}

// LayoutKey holds the layout of the daemons that share a Redis, so that a daemon told
// none takes theirs, and one told a layout that cannot run beside theirs refuses to. It
// can never be a record's key: RecordKey has a second colon, LeanKey and the pending
// indexes begin with '{'. On a Cluster it lives on the master of its slot, where every
// daemon reaches it as it reaches a record.
const LayoutKey = "idem:layout"

// ErrLayoutConflict says that the layout a store was asked for cannot run beside the
// daemons that share its Redis: the ones of one side would not see the records of the
// other, and could hand out a key twice.
var ErrLayoutConflict = errors.New("record layout conflict")

// Agreement is the layout a store settled on, and why.
type Agreement struct {
	Layout Layout
	// Reason says why, in words for the log.
	Reason string
}

//go:embed layout.lua
var layoutSource string

var layoutScript = redis.NewScript(layoutSource)

// How a store with LayoutAuto looks for records when the layout key is absent: SCAN
// calls of scanCount keys on each master, until one finds a record's key, the master
// has no more, scanBudget has passed or maxScanCalls were made. On a Redis of idemd's
// the first call finds a record (nothing else lives there but the pending indexes); the
// budget is spent only where other applications' keys hide whether any record is there.
//
// Redis keeps back, by scanMatch, every key that begins with neither 'i' nor '{', as no
// record's key does: other applications' keys then cost the scan their iteration but
// not their transfer (1 to 1.6 M keys a second on loopback, against 0.7 to 1.3 M
// without it, and the more so on a slower link).
const (
	scanCount    = 1000
	scanMatch    = "[i{]*"
	maxScanCalls = 100_000
)

// scanBudget is how long the scan of each master may take (Store.scanBudget, which
// tests shorten).
const scanBudget = 2 * time.Second

// agreeTimeout bounds one attempt to agree: reading the key, a scan, writing the key.
const agreeTimeout = 10 * time.Second

// layoutCheckEvery is how often a store that agreed its layout writes it back into
// the layout key where the key is gone, and checks that the key names a layout beside
// its own (Store.watchLayout): one small script a second for each daemon.
const layoutCheckEvery = time.Second

// layoutState is how a store writes and reads records once its layout is settled.
type layoutState struct {
	layout  Layout
	scripts *scripts
	// lean says whether the scripts may meet lean records (LeanReady, LeanRecords) and
	// so need the values in the lean layout's form too.
	lean bool
	// writesLean says whether the scripts write lean records (LeanRecords), which keep
	// headers only as packHeaders packs them: such scripts never read the headers as
	// JSON.
	writesLean bool
}

func newLayoutState(opts Options) *layoutState {
	l := &layoutState{layout: layoutOf(opts), scripts: stringScripts, lean: opts.LeanReady || opts.LeanRecords,
		writesLean: opts.LeanRecords && !opts.HashRecords}
	switch {
	case opts.HashRecords:
		l.scripts = hashScripts
	case opts.LeanRecords && opts.LeanOnly:
		l.scripts = leanOnlyScripts
	case opts.LeanRecords:
		l.scripts = leanScripts
	case opts.LeanReady:
		l.scripts = leanReadyScripts
	}
	return l
}

// agreement is one attempt to settle the layout, which every call that needs it while
// it runs waits for.
type agreement struct {
	done   chan struct{}
	result Agreement
	err    error
}

// AgreeLayout settles the store's layout with the layout key, when Options.Layout asks
// for that, and says what it chose and why. A store settles before its first call
// anyway; a daemon calls AgreeLayout at start-up so that a layout that cannot run
// beside the others (ErrLayoutConflict) stops it there. Any other error says that
// Redis did not answer in time: the store tries again at its next call, and answers
// unavailable until it has settled.
//
// A layout asked for moves the key forward to it, never back, and is refused when the
// key names a layout more than one step further along the upgrade (or one this release
// does not know), whose daemons would not see this one's records.
//
// LayoutAuto takes the layout that the key names. Where it names none, this store is
// the first of its release here, and it looks on every master for a record's key:
//   - none (an empty Redis, or one of other applications' keys only): lean-only. No
//     daemon of this release wrote an earlier layout, or the key would say so, and
//     none of an earlier release has written anything that lives.
//   - records at the earlier keys: strings, so that daemons of the previous release,
//     which read nothing else, can run beside it through a rolling upgrade.
//   - lean records (the key was lost, say in a failover): lean, which reads both.
//   - no answer within the scan's budget: strings, the layout that is safe beside the
//     previous release.
//
// It then writes its choice where the key is still absent (Redis's SET NX, in a
// script) and takes whatever the key says after, so that daemons starting together
// agree.
//
// Once agreed, the store keeps the key: it writes its layout back where the key is
// gone, and answers unavailable while the key names a layout not beside its own (see
// watchLayout).
func (s *Store) AgreeLayout(ctx context.Context) (Agreement, error) {
	if l := s.layout.Load(); l != nil && s.opts.Layout == "" {
		return Agreement{Layout: l.layout, Reason: "set by the store's options"}, nil
	}
	a := s.agreeing()
	select {
	case <-a.done:
		return a.result, a.err
	case <-ctx.Done():
		return Agreement{}, fmt.Errorf("redis: %w", ctx.Err())
	}
}

// current is the store's layout, settled first if need be: an engine error (unavailable,
// or the caller's context) when it cannot be.
func (s *Store) current(ctx context.Context) (*layoutState, error) {
	if l := s.layout.Load(); l != nil {
		if c := s.apart.Load(); c != nil {
			return nil, engine.Unavailable(*c)
		}
		return l, nil
	}
	a := s.agreeing()
	select {
	case <-a.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("redis: %w", ctx.Err())
	}
	if a.err != nil {
		return nil, engine.Unavailable(a.err)
	}
	return s.current(ctx)
}

// agreeing returns the attempt to settle the layout that runs now, starting one if none
// does, or the one that settled it. It runs apart from its callers, so that a caller
// with a short deadline neither cuts a scan short nor leaves the others without an
// answer; Close ends it. A conflict stays: only a restart with another layout ends it.
func (s *Store) agreeing() *agreement {
	s.agreeMu.Lock()
	defer s.agreeMu.Unlock()
	if s.closing.Err() != nil {
		a := &agreement{done: make(chan struct{}), err: errClosed}
		close(a.done)
		return a
	}
	if a := s.agreed; a != nil {
		select {
		case <-a.done:
			if a.err == nil || errors.Is(a.err, ErrLayoutConflict) {
				return a
			}
		default:
			return a
		}
	}
	a := &agreement{done: make(chan struct{})}
	s.agreed = a
	s.agreeWG.Add(1)
	go func() {
		defer s.agreeWG.Done()
		defer close(a.done)
		ctx, cancel := context.WithTimeout(s.closing, agreeTimeout)
		defer cancel()
		var loud bool
		a.result, loud, a.err = s.settle(ctx)
		switch {
		case errors.Is(a.err, ErrLayoutConflict):
			s.logger.Error("redis record layout refused", "err", a.err)
		case a.err != nil:
			s.reloadOnNetworkError(a.err)
		case loud:
			s.logger.Warn("redis record layout", "layout", a.result.Layout, "why", a.result.Reason, "layout_key", LayoutKey)
		default:
			s.logger.Info("redis record layout", "layout", a.result.Layout, "why", a.result.Reason, "layout_key", LayoutKey)
		}
		if a.err == nil {
			s.layout.Store(newLayoutState(a.result.Layout.options(s.opts)))
			s.agreeWG.Add(1)
			go s.watchLayout(a.result.Layout)
		}
	}()
	return a
}

// watchLayout keeps the layout key while the store is open, every layoutCheckEvery.
// A key that is gone (a Redis restarted without persistence, a FLUSHALL) gets the
// store's layout back, so that a daemon started afterwards does not take the Redis
// for a new one and choose a layout that the daemons running would not see. A key
// that names a layout not beside the store's (a daemon started at a layout more than
// a step ahead, or one that found the key gone first and chose another) makes the
// store answer unavailable until the key names one beside it again: the daemons of
// the two layouts would hand keys out twice.
func (s *Store) watchLayout(mine Layout) {
	defer s.agreeWG.Done()
	tick := time.NewTicker(layoutCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.closing.Done():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(s.closing, layoutCheckEvery)
		_, now, err := s.layoutKey(ctx, mine, "absent")
		cancel()
		if err != nil {
			// Redis does not answer: neither do the calls, and the next look will tell.
			continue
		}
		was := s.apart.Load()
		switch {
		case !beside(mine, now) && was == nil:
			err := fmt.Errorf("%w: the layout key %s now says %q, which cannot run beside this daemon's %s: it answers 503 until the key names a layout beside %s again (docs/upgrading.md, Upgrading)",
				ErrLayoutConflict, LayoutKey, now, mine, mine)
			s.apart.Store(&err)
			s.logger.Error("redis record layout refused", "err", err)
		case beside(mine, now) && was != nil:
			s.apart.Store(nil)
			s.logger.Info("redis record layout agreed again", "layout", mine, "layout_key_says", now)
		}
	}
}

// settle decides the store's layout (see AgreeLayout); loud says that the reason
// deserves a warning.
func (s *Store) settle(ctx context.Context) (a Agreement, loud bool, err error) {
	asked := s.opts.Layout
	if asked != LayoutAuto && asked.step() < 0 {
		return a, false, fmt.Errorf("%w: %q is no layout of this release", ErrLayoutConflict, asked)
	}
	if asked != LayoutAuto {
		before, after, err := s.layoutKey(ctx, asked, "forward")
		if err != nil {
			return a, false, err
		}
		a.Layout = asked
		switch {
		case after.step() < 0:
			return a, false, fmt.Errorf("%w: the layout key %s says %q, a layout this release does not know: daemons of a later release use this Redis", ErrLayoutConflict, LayoutKey, after)
		case !beside(asked, after):
			return a, false, fmt.Errorf("%w: %s cannot run beside the daemons of this Redis, which use %s (the layout key %s says so): they would not see each other's records. Take %s or %s; going further back is in docs/upgrading.md, Upgrading",
				ErrLayoutConflict, asked, after, LayoutKey, after, layoutSteps[after.step()-1])
		case before == "":
			a.Reason = "as asked; the layout key was absent and now says so"
		case before == after && after == asked:
			a.Reason = "as asked, and as the layout key says"
		case before != after && asked.step() > before.step()+1:
			loud = true
			a.Reason = fmt.Sprintf("as asked, which skips the steps after %s, the layout key's until now: daemons still running at %s would not see this one's records, unless every one of them was stopped first", before, before)
		case before != after:
			a.Reason = fmt.Sprintf("as asked; the layout key moved from %s to it", before)
		default:
			a.Reason = fmt.Sprintf("as asked, one step before the layout key's %s, beside whose daemons it runs", after)
		}
		return a, loud, nil
	}

	_, now, err := s.layoutKey(ctx, LayoutStrings, "read")
	if err != nil {
		return a, false, err
	}
	if now != "" {
		if now.step() < 0 {
			return a, false, fmt.Errorf("%w: the layout key %s says %q, a layout this release does not know: daemons of a later release use this Redis", ErrLayoutConflict, LayoutKey, now)
		}
		return Agreement{Layout: now, Reason: "the layout key says so: the daemons before this one agreed on it"}, false, nil
	}
	chosen, why, err := s.survey(ctx)
	if err != nil {
		return a, false, err
	}
	_, now, err = s.layoutKey(ctx, chosen, "absent")
	switch {
	case err != nil:
		return a, false, err
	case now.step() < 0:
		return a, false, fmt.Errorf("%w: the layout key %s says %q, a layout this release does not know: daemons of a later release use this Redis", ErrLayoutConflict, LayoutKey, now)
	case now != chosen:
		return Agreement{Layout: now, Reason: fmt.Sprintf("another daemon wrote it in the layout key as this one looked (this one would have taken %s: %s)", chosen, why)}, false, nil
	}
	return Agreement{Layout: chosen, Reason: why + "; the layout key now says so, for the daemons after it"}, false, nil
}

// layoutKey runs the layout key's script with layout l and mode ("read", "absent" or
// "forward"), and returns the key's value before and after ("" for none).
func (s *Store) layoutKey(ctx context.Context, l Layout, mode string) (before, after Layout, err error) {
	v, err := layoutScript.Run(ctx, s.client, []string{LayoutKey}, string(l), mode).Slice()
	if err != nil {
		return "", "", fmt.Errorf("the layout key: %w", err)
	}
	if len(v) != 2 {
		return "", "", fmt.Errorf("the layout key's script answered %v", v)
	}
	b, _ := v[0].(string)
	n, _ := v[1].(string)
	return Layout(b), Layout(n), nil
}

// survey looks on every master for records' keys (see AgreeLayout), and returns the
// layout that what it found allows, and why.
func (s *Store) survey(ctx context.Context) (Layout, string, error) {
	var (
		mu      sync.Mutex
		keys    int64
		scanned int64
		earlier string
		lean    string
		unsure  []string
	)
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err != nil {
			return fmt.Errorf("DBSIZE on %s: %w", m.Options().Addr, err)
		}
		var calls int
		var foundEarlier, foundLean string
		finished := n == 0
		start := time.Now()
		var cursor uint64
		for ; !finished && calls < maxScanCalls && time.Since(start) < s.scanBudget; calls++ {
			batch, next, err := m.Scan(ctx, cursor, scanMatch, scanCount).Result()
			if err != nil {
				return fmt.Errorf("SCAN on %s: %w", m.Options().Addr, err)
			}
			for _, k := range batch {
				switch {
				case foundEarlier == "" && isRecordKey(k):
					foundEarlier = k
				case foundLean == "" && isLeanKey(k):
					foundLean = k
				}
			}
			// The whole batch is read before stopping, so that a Redis holding records
			// of both kinds most likely shows a lean one.
			finished = next == 0 || foundEarlier != "" || foundLean != ""
			cursor = next
		}
		mu.Lock()
		defer mu.Unlock()
		keys += n
		// SCAN looks at about COUNT keys a call, whatever MATCH keeps back.
		scanned += min(n, int64(calls)*scanCount)
		if earlier == "" {
			earlier = foundEarlier
		}
		if lean == "" {
			lean = foundLean
		}
		if !finished {
			unsure = append(unsure, m.Options().Addr)
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	switch {
	case lean != "":
		return LayoutLean, fmt.Sprintf("the Redis holds lean records (%q) but no layout key, which a failover may have lost; lean reads every layout", lean), nil
	case earlier != "":
		return LayoutStrings, fmt.Sprintf("the Redis holds records of an earlier layout (%s): daemons of the previous release may share it, and they read strings only; the move to the lean layout is in docs/upgrading.md, Upgrading", earlier), nil
	case len(unsure) > 0:
		slices.Sort(unsure)
		return LayoutStrings, fmt.Sprintf("no record among about %d of the Redis's %d keys, where the scan of %s stopped after %s; records of an earlier layout may be among the rest, so strings, as the previous release writes; --redis-record-layout lean-only takes the lean layout where no daemon of an earlier release runs",
			scanned, keys, strings.Join(unsure, ", "), s.scanBudget), nil
	case keys == 0:
		return LayoutLeanOnly, "the Redis is empty: no record of an earlier layout to read", nil
	}
	return LayoutLeanOnly, fmt.Sprintf("the Redis holds no record among its %d keys: no record of an earlier layout to read", keys), nil
}

// isRecordKey says whether k is a record's key of the layouts before the lean one
// (RecordKey): idem:, a tenant, ':' and 64 digits of lowercase hex.
func isRecordKey(k string) bool {
	rest, ok := strings.CutPrefix(k, "idem:")
	if !ok || len(rest) < 2+64 || rest[len(rest)-65] != ':' {
		return false
	}
	return isTenant(rest[:len(rest)-65]) && lowerHex(rest[len(rest)-64:])
}

// isLeanKey says whether k is a record's key of the lean layout (LeanKey): '{', two
// bytes, '}', a tenant, ':' and 32 bytes. The pending indexes have a NUL where the
// tenant would begin.
func isLeanKey(k string) bool {
	if len(k) < 4+1+1+32 || k[0] != '{' || k[3] != '}' || k[len(k)-33] != ':' {
		return false
	}
	return isTenant(k[4 : len(k)-33])
}

// isTenant says whether t may be a tenant's name as idemd's auth file allows them.
func isTenant(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
