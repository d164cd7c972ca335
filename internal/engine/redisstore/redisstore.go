// Package redisstore keeps idemd's records in Redis: standalone, Sentinel or Cluster.
//
// Each record is one string under its own key, and each transition is one Lua script that
// touches only that record's keys: the key it has in the lean layout and the key of
// earlier releases, in one Cluster slot, so every script runs unchanged on Redis Cluster. Concurrent
// calls share round trips: their scripts go to Redis together as one pipeline (see
// pipeliner), and a call that finds Redis idle goes out alone, at once.
package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/lua"
)

// Client is what the store needs of a Redis deployment. Adapt makes one of a go-redis
// client (standalone, Sentinel or Cluster); a wrapper of its own (to trace or count
// calls) implements it whole, so that nothing the store needs is found missing at run
// time.
type Client interface {
	redis.Scripter
	Ping(ctx context.Context) *redis.StatusCmd
	// Pipeline sends the scripts of concurrent calls together; a Cluster pipeline
	// splits them by node.
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Close() error
	// MasterFor returns the client of the one master that holds key: the Cluster master
	// of its slot, or the standalone (or Sentinel-chosen) master itself. Replica
	// acknowledgements run WAIT on it.
	MasterFor(ctx context.Context, key string) (*redis.Client, error)
	// ForEachMaster calls fn for every master, concurrently on a Cluster.
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, master *redis.Client) error) error
	// ReloadSlots re-reads a Cluster's slot map; other deployments have none.
	ReloadSlots(ctx context.Context)
}

// Adapt makes a Client of a go-redis client: *redis.Client (standalone, or the
// Sentinel failover client) or *redis.ClusterClient.
func Adapt(c redis.UniversalClient) (Client, error) {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return clusterClient{c}, nil
	case *redis.Client:
		return singleClient{c}, nil
	}
	return nil, fmt.Errorf("redisstore: cannot adapt a %T; implement redisstore.Client", c)
}

// singleClient is one master, standalone or chosen by Sentinel.
type singleClient struct{ *redis.Client }

func (c singleClient) MasterFor(context.Context, string) (*redis.Client, error) { return c.Client, nil }

func (c singleClient) ForEachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	return fn(ctx, c.Client)
}

func (singleClient) ReloadSlots(context.Context) {}

// clusterClient has ForEachMaster from *redis.ClusterClient itself.
type clusterClient struct{ *redis.ClusterClient }

func (c clusterClient) MasterFor(ctx context.Context, key string) (*redis.Client, error) {
	return c.MasterForKey(ctx, key)
}

func (c clusterClient) ReloadSlots(ctx context.Context) { c.ReloadState(ctx) }

// scripts are the transitions' scripts in one layout, loaded once; the store sends
// EVALSHA and falls back to EVAL when the server does not know a script yet.
type scripts struct {
	claim, complete, release, extend, mark, lookup, purge, watch script
	// export and importRecord move records (port.go); moveOut, confirmMoved and peek
	// hand them over in a live move (move.go).
	export, importRecord        script
	moveOut, confirmMoved, peek script
}

var (
	stringScripts    = loadScripts(lua.StringRecords, false)
	leanReadyScripts = loadScripts(lua.StringRecords, true)
	leanScripts      = loadScripts(lua.LeanRecords, true)
	leanOnlyScripts  = loadScripts(lua.LeanRecords, false)
	hashScripts      = loadScripts(lua.HashRecords, false)
)

func loadScripts(layout lua.Layout, readOther bool) *scripts {
	return &scripts{
		claim:    load("claim", layout, readOther, true),
		complete: load("complete", layout, readOther, true),
		release:  load("release", layout, readOther, true),
		extend:   load("extend", layout, readOther, true),
		mark:     load("mark", layout, readOther, true),
		lookup:   load("lookup", layout, readOther, false),
		purge:    load("purge", layout, readOther, true),
		watch:    load("watch", layout, readOther, true),

		export:       load("export", layout, readOther, false),
		importRecord: load("import", layout, readOther, true),
		moveOut:      load("moveout", layout, readOther, true),
		confirmMoved: load("confirm", layout, readOther, true),
		peek:         load("peek", layout, readOther, false),
	}
}

// script is a transition's script and whether it writes, which is what replica
// acknowledgements wait for.
type script struct {
	*redis.Script
	writes bool
}

func load(transition string, layout lua.Layout, readOther, writes bool) script {
	src, err := lua.Source(transition, layout, readOther)
	if err != nil {
		panic(err)
	}
	return script{redis.NewScript(src), writes}
}

// Store is the Redis-backed engine.Store.
type Store struct {
	client   Client
	notifier *notifier
	pipe     *pipeliner
	opts     Options
	logger   *slog.Logger
	// scanBudget bounds the look for records on each master (see AgreeLayout).
	scanBudget time.Duration
	// layout is how the store writes and reads records: set by New from the options,
	// or, with Options.Layout, once the store has agreed it with the layout key
	// (AgreeLayout); nil until then.
	layout atomic.Pointer[layoutState]
	// apart, when set, says why the layout key no longer names a layout beside the
	// store's (watchLayout): every call answers unavailable meanwhile.
	apart atomic.Pointer[error]
	// agreed is the latest attempt to agree the layout; agreeWG waits for it and for
	// watchLayout, and closing ends both, at Close.
	agreeMu sync.Mutex
	agreed  *agreement
	agreeWG sync.WaitGroup
	closing context.Context
	stop    context.CancelFunc
	// usagePlace is where the release before this one kept usage (soleUsage), once
	// decided; usage holds what the scripts counted and the store has yet to send.
	usagePlace atomic.Int32
	usage      usageCounts
	// dueNotes are the slots and lease expiries still to add to the tenants' due
	// indexes (due.go).
	dueNotes dueNotes
	// heartbeat is what the store says of itself in Redis (heartbeat.go), when OpenWith
	// opened it; its instance names its connections.
	heartbeat heartbeat
}

// New returns a Store over client. The store owns the client and closes it.
func New(client Client, opts Options) *Store {
	if opts.ReplicaAcks > 0 && opts.ReplicaTimeout <= 0 {
		opts.ReplicaTimeout = DefaultReplicaTimeout
	}
	s := &Store{client: client, notifier: newNotifier(client), pipe: newPipeliner(client, opts), opts: opts, logger: opts.Logger,
		scanBudget: scanBudget}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.closing, s.stop = context.WithCancel(context.Background())
	if opts.Layout == "" {
		s.layout.Store(newLayoutState(opts))
	}
	return s
}

// RecordKey is the Redis key of a record in the layouts of earlier releases, and the
// name of its change channel: the tenant, then the SHA-256 of the client's key in hex,
// so that any key fits in a Redis key and keys spread over all Cluster slots. The lean
// layout keeps records at LeanKey, in the same slot.
func RecordKey(id engine.ID) string { return recordKeys(id)[0] }

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func flag(b bool) string {
	if b {
		return "1"
	}
	return ""
}

// compact is v in the lean layout's form when the scripts may meet lean records. A
// store that neither writes nor reads them sends v itself, which the scripts compare
// as they compare v ("" would match a stored empty value).
func (l *layoutState) compact(v string) string {
	if !l.lean {
		return v
	}
	return compact(v)
}

// packHeaders is h in the lean layout's form when the scripts may meet lean records,
// and "" otherwise: only a script writing a lean record stores it.
func (l *layoutState) packHeaders(h map[string][]string) (string, error) {
	if !l.lean {
		return "", nil
	}
	return packHeaders(h)
}

// encodeHeaders is h as the string and hash layouts keep headers (JSON), and "" where
// the scripts write lean records: they keep packHeaders's form only.
func (l *layoutState) encodeHeaders(h map[string][]string) (string, error) {
	if l.writesLean {
		return "", nil
	}
	return encodeHeaders(h)
}

// Claim implements engine.Store.
func (s *Store) Claim(ctx context.Context, c engine.Claim) (engine.ClaimResult, error) {
	l, err := s.current(ctx)
	if err != nil {
		return engine.ClaimResult{}, err
	}
	keys := scriptKeys(c.ID.Tenant, sha256.Sum256([]byte(c.ID.Key)))
	rep, err := s.runKeys(ctx, l.scripts.claim, keys, c.ID,
		c.Token, c.Fingerprint, c.Owner, ms(c.Lease), ms(c.Retention), c.ID.Key, c.ID.Tenant, c.Secret, flag(c.Waiting),
		l.compact(c.Token), l.compact(c.Fingerprint), l.compact(c.Secret))
	if err != nil {
		return engine.ClaimResult{}, err
	}
	switch rep.status {
	case "acquired":
		s.noteDue(c.ID.Tenant, slot(keys[0]), rep.record.LeaseExpiresAt)
		return engine.ClaimResult{Outcome: engine.OutcomeAcquired, Record: rep.record}, nil
	case "completed":
		return engine.ClaimResult{Outcome: engine.OutcomeCompleted, Record: rep.record}, nil
	case "failed":
		return engine.ClaimResult{Outcome: engine.OutcomeFailed, Record: rep.record}, nil
	case "in_progress":
		return engine.ClaimResult{Record: rep.record},
			&engine.InProgressError{RetryAfter: rep.record.LeaseExpiresAt.Sub(rep.now)}
	case "mismatch":
		return engine.ClaimResult{}, engine.ErrFingerprintMismatch
	}
	return engine.ClaimResult{}, rep.unexpected()
}

// Complete implements engine.Store.
func (s *Store) Complete(ctx context.Context, c engine.Completion) (engine.Record, error) {
	l, err := s.current(ctx)
	if err != nil {
		return engine.Record{}, err
	}
	headers, err := l.encodeHeaders(c.Response.Headers)
	if err != nil {
		return engine.Record{}, err
	}
	packed, err := l.packHeaders(c.Response.Headers)
	if err != nil {
		return engine.Record{}, err
	}
	rep, err := s.run(ctx, l.scripts.complete, c.ID,
		c.LeaseToken, strconv.Itoa(c.Response.Status), headers, c.Response.Body, ms(c.Retention),
		l.compact(c.LeaseToken), packed, c.ID.Key)
	if err != nil {
		return engine.Record{}, err
	}
	return rep.record, rep.transitionErr()
}

// Release implements engine.Store.
func (s *Store) Release(ctx context.Context, r engine.Release) (engine.Record, error) {
	l, err := s.current(ctx)
	if err != nil {
		return engine.Record{}, err
	}
	status, headers, packed, body := "", "", "", []byte(nil)
	if r.Response != nil {
		if headers, err = l.encodeHeaders(r.Response.Headers); err != nil {
			return engine.Record{}, err
		}
		if packed, err = l.packHeaders(r.Response.Headers); err != nil {
			return engine.Record{}, err
		}
		status, body = strconv.Itoa(r.Response.Status), r.Response.Body
	}
	rep, err := s.run(ctx, l.scripts.release, r.ID,
		r.LeaseToken, string(r.Mode), status, headers, body, ms(r.Retention), l.compact(r.LeaseToken), packed, r.ID.Key)
	if err != nil {
		return engine.Record{}, err
	}
	return rep.record, rep.transitionErr()
}

// Extend implements engine.Store.
func (s *Store) Extend(ctx context.Context, e engine.Extension) (engine.Record, error) {
	l, err := s.current(ctx)
	if err != nil {
		return engine.Record{}, err
	}
	rep, err := s.run(ctx, l.scripts.extend, e.ID, e.LeaseToken, ms(e.Lease), l.compact(e.LeaseToken), e.ID.Key)
	if err != nil {
		return engine.Record{}, err
	}
	return rep.record, rep.transitionErr()
}

// Mark implements engine.Store.
func (s *Store) Mark(ctx context.Context, m engine.Mark) (engine.Record, error) {
	l, err := s.current(ctx)
	if err != nil {
		return engine.Record{}, err
	}
	rep, err := s.run(ctx, l.scripts.mark, m.ID, m.LeaseToken, m.Name, m.Data, l.compact(m.LeaseToken))
	if err != nil {
		return engine.Record{}, err
	}
	return rep.record, rep.transitionErr()
}

// Lookup implements engine.Store.
func (s *Store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	l, err := s.current(ctx)
	if err != nil {
		return engine.Record{}, err
	}
	rep, err := s.run(ctx, l.scripts.lookup, id)
	if err != nil {
		return engine.Record{}, err
	}
	return rep.record, rep.transitionErr()
}

// Purge implements engine.Store.
func (s *Store) Purge(ctx context.Context, id engine.ID) error {
	l, err := s.current(ctx)
	if err != nil {
		return err
	}
	rep, err := s.run(ctx, l.scripts.purge, id, id.Key)
	if err != nil {
		return err
	}
	return rep.transitionErr()
}

// Watch implements engine.Store through Redis pub/sub: the scripts publish on the
// record's key as channel name whenever a pending record changes, but only once the
// record is marked as watched, so that the usual completion, which nobody waits for,
// publishes nothing. Watch marks the record after subscribing; a record created after
// that is marked by the first claim that waits on it (engine.Claim.Waiting), which a
// waiter sends after Watch.
func (s *Store) Watch(ctx context.Context, id engine.ID) (engine.Watch, error) {
	l, err := s.current(ctx)
	if err != nil {
		return nil, err
	}
	key := RecordKey(id)
	w, err := s.notifier.watch(ctx, key)
	if err != nil {
		return nil, err
	}
	v, err := l.scripts.watch.Run(ctx, s.client, scriptKeys(id.Tenant, sha256.Sum256([]byte(id.Key)))).Result()
	if err != nil {
		w.Close()
		if isMoved(err) {
			return nil, engine.ErrStoreMoved
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("redis: %w", ctx.Err())
		}
		s.reloadOnNetworkError(err)
		return nil, engine.Unavailable(err)
	}
	if marked, ok := v.([]any); ok && len(marked) == 2 {
		s.count(id.Tenant, marked[1])
	}
	return w, nil
}

// reloadOnNetworkError asks a Cluster client to re-read the slot map after a failure
// that was not Redis's answer, such as a refused connection to a master that died.
// go-redis reloads on MOVED and ASK but, for a dead master, only at its periodic
// reload (redis/go-redis#3979); a failover would otherwise look like an outage for up
// to that long. go-redis debounces the reloads.
func (s *Store) reloadOnNetworkError(err error) {
	var answered redis.Error
	if !errors.As(err, &answered) {
		s.client.ReloadSlots(context.Background())
	}
}

// Ping implements engine.Store. A store that has not agreed its layout yet (or cannot)
// is not ready, however well Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.current(ctx); err != nil {
		return err
	}
	if err := s.client.Ping(ctx).Err(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("redis: %w", ctx.Err())
		}
		return engine.Unavailable(err)
	}
	return nil
}

// Close ends an attempt to agree the layout, answers unavailable to the calls still
// queued, waits for the pipelines in flight, stops notifications and closes the client.
func (s *Store) Close() error {
	// The leases handed out last are in the due indexes now rather than at the next sweep.
	flush, cancel := context.WithTimeout(context.Background(), time.Second)
	if notes := s.dueNotes.take(""); len(notes) > 0 {
		_ = s.addDue(flush, notes)
	}
	cancel()
	s.agreeMu.Lock()
	s.stop()
	s.agreeMu.Unlock()
	s.agreeWG.Wait()
	// What the scripts counted and the store has not sent yet goes now, once.
	ctx, cancel := context.WithTimeout(context.Background(), usageTimeout)
	s.sendUsage(ctx, s.usage.takeToSend())
	cancel()
	s.pipe.close()
	s.notifier.close()
	return s.client.Close()
}

func (s *Store) run(ctx context.Context, script script, id engine.ID, args ...any) (reply, error) {
	return s.runKeys(ctx, script, scriptKeys(id.Tenant, sha256.Sum256([]byte(id.Key))), id, args...)
}

// runKeys is run on the keys of a record, which id names in the answer.
func (s *Store) runKeys(ctx context.Context, script script, keys []string, id engine.ID, args ...any) (reply, error) {
	if script.writes {
		// A usage read of the tenant that begins meanwhile waits for this write's count.
		epoch := s.usage.writing(id.Tenant)
		defer s.usage.wrote(id.Tenant, epoch)
	}
	v, err := s.pipe.do(ctx, script, keys, args)
	return s.scriptReply(ctx, v, err, id)
}

// scriptReply reads what a script on id's record answered (v, or err), and counts in
// the usage what it moved.
func (s *Store) scriptReply(ctx context.Context, v any, err error, id engine.ID) (reply, error) {
	var notReplicated *notReplicatedError
	if errors.As(err, &notReplicated) {
		return reply{}, err
	}
	if errors.Is(err, errClosed) {
		return reply{}, engine.Unavailable(err)
	}
	if isMoved(err) {
		return reply{}, engine.ErrStoreMoved
	}
	if err != nil {
		if ctx.Err() != nil {
			// The caller gave up; that says nothing about Redis.
			return reply{}, fmt.Errorf("redis: %w", ctx.Err())
		}
		s.reloadOnNetworkError(err)
		return reply{}, engine.Unavailable(err)
	}
	rep, err := parseReply(v, id)
	if err != nil {
		return reply{}, engine.Unavailable(err)
	}
	if rep.usage != nil {
		s.count(id.Tenant, rep.usage)
	}
	return rep, nil
}

// isMoved says whether err is a script's refusal of a marker (lua/prelude.lua's
// moved): Redis's answer, not a failure of it.
func isMoved(err error) bool {
	if err == nil {
		return false
	}
	var answered redis.Error
	return errors.As(err, &answered) && strings.HasPrefix(answered.Error(), "STOREMOVED ")
}

type reply struct {
	status string
	now    time.Time
	record engine.Record
	// usage is what the script moved in the tenant's usage (lua/prelude.lua's ACCT),
	// nil when nothing.
	usage []any
}

// transitionErr maps the statuses every transition script can answer.
func (r reply) transitionErr() error {
	switch r.status {
	case "ok":
		return nil
	case "not_found":
		return engine.ErrNotFound
	case "lease_lost":
		return engine.ErrLeaseLost
	}
	return r.unexpected()
}

func (r reply) unexpected() error {
	return engine.Unavailable(fmt.Errorf("unexpected script status %q", r.status))
}

// The positions of the fields in a script's answer, after status and time, as
// lua/prelude.lua's answer gives them. In place of the key comes what the script moved
// in the usage, and the tenant is always empty: the lean layout does not keep either,
// and the record is the one asked for.
const (
	fUsage = iota
	fTenant
	fState
	fFingerprint
	fOwner
	fAttempt
	fToken
	fLeaseExpiry
	fRecovered
	fCreated
	fUpdated
	fExpires
	metaFields
)

// parseReply reads a script's answer. Each field is a string or, for numbers read
// from or written as a record of the current layout, an integer; ” is none.
func parseReply(v any, id engine.ID) (reply, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < 2+metaFields {
		return reply{}, fmt.Errorf("malformed script answer %T", v)
	}
	for i, x := range vals {
		switch x.(type) {
		case string, int64, nil:
		case []any:
			if i == 2+fUsage {
				continue
			}
			return reply{}, fmt.Errorf("malformed script answer field %d: %T", i, x)
		default:
			return reply{}, fmt.Errorf("malformed script answer field %d: %T", i, x)
		}
	}
	status, _ := vals[0].(string)
	rep := reply{status: status, now: msTime(vals[1])}
	f := vals[2:]
	rep.usage, _ = f[fUsage].([]any)
	if str(f[fState]) == "" {
		rep.record = engine.Record{ID: id}
		return rep, nil
	}
	// The record is the one asked for: the lean layout does not keep its key.
	rec := engine.Record{
		ID:          id,
		State:       decodeState(str(f[fState])),
		Fingerprint: expand(str(f[fFingerprint])),
		Owner:       str(f[fOwner]),
		Attempt:     integer(f[fAttempt]),
		LeaseToken:  expand(str(f[fToken])),
		Recovered:   str(f[fRecovered]) == "1",
		CreatedAt:   msTime(f[fCreated]),
		UpdatedAt:   msTime(f[fUpdated]),
		ExpiresAt:   msTime(f[fExpires]),
	}
	if rec.State == engine.StatePending {
		rec.LeaseExpiresAt = msTime(f[fLeaseExpiry])
	}
	if resp := f[metaFields:]; len(resp) >= 3 && integer(resp[0]) != 0 {
		status := int(integer(resp[0]))
		headers, err := unpackHeaders(str(resp[1]))
		if err != nil {
			return reply{}, err
		}
		rec.Response = &engine.Response{Status: status, Headers: headers, Body: []byte(str(resp[2]))}
	}
	if point := f[metaFields:]; len(point) == 7 {
		rec.RecoveryPoint = &engine.RecoveryPoint{Name: str(point[3]), Attempt: integer(point[5]), RecordedAt: msTime(point[6])}
		if data := str(point[4]); data != "" {
			rec.RecoveryPoint.Data = []byte(data)
		}
	}
	rep.record = rec
	return rep, nil
}

// str is a string field of an answer; any other is none.
func str(x any) string {
	s, _ := x.(string)
	return s
}

// integer is a numeric field of an answer: an integer, or a decimal string as records
// of earlier releases keep it; 0 for none.
func integer(x any) int64 {
	switch x := x.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func decodeState(s string) engine.State {
	switch s {
	case "p":
		return engine.StatePending
	case "r":
		return engine.StateReleased
	case "c":
		return engine.StateCompleted
	case "f":
		return engine.StateFailed
	}
	return engine.State(s)
}

// msTime is a time field of an answer, in ms since the epoch; zero for none.
func msTime(x any) time.Time {
	n := integer(x)
	if n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

func encodeHeaders(h map[string][]string) (string, error) {
	if len(h) == 0 {
		return "", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
