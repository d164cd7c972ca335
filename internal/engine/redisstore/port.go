package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// Export implements engine.Porter: it SCANs every master (one after the other, so
// that fn is called from one goroutine) for records' keys, scanCount at a time, and
// reads each batch's records with the export script in one pipeline. A record moved
// between the layouts' keys while the scan runs (a daemon of the lean layout writing a
// record of an earlier one) may be missed or seen twice: export after an upgrade of the
// layout has finished. A record seen twice imports the second time as ImportSame.
func (s *Store) Export(ctx context.Context, fn func(engine.Exported) error) error {
	l, err := s.current(ctx)
	if err != nil {
		return err
	}
	var masters []*redis.Client
	var mu sync.Mutex
	if err := s.client.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, m)
		return nil
	}); err != nil {
		return engine.Unavailable(err)
	}
	for _, m := range masters {
		if err := s.exportMaster(ctx, l, m, fn); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) exportMaster(ctx context.Context, l *layoutState, m *redis.Client, fn func(engine.Exported) error) error {
	unavailable := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("redis: %w", ctx.Err())
		}
		return engine.Unavailable(fmt.Errorf("export from %s: %w", m.Options().Addr, err))
	}
	if err := l.scripts.export.Load(ctx, m).Err(); err != nil {
		return unavailable(err)
	}
	var cursor uint64
	for {
		keys, next, err := m.Scan(ctx, cursor, scanMatch, scanCount).Result()
		if err != nil {
			return unavailable(err)
		}
		type found struct {
			id     engine.ID
			digest [32]byte
			cmd    *redis.Cmd
		}
		var batch []found
		_, err = m.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				tenant, digest, ok := recordOfKey(k)
				if !ok {
					continue
				}
				cmd := l.scripts.export.EvalSha(ctx, p, digestKeys(tenant, digest))
				batch = append(batch, found{engine.ID{Tenant: tenant}, digest, cmd})
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) && !isMoved(err) {
			return unavailable(err)
		}
		for _, f := range batch {
			v, err := f.cmd.Slice()
			if isMoved(err) {
				// A marker: its record has moved, and a stream that left it out would
				// say the key is free.
				return engine.ErrStoreMoved
			}
			if err != nil {
				return unavailable(err)
			}
			e, ok, err := exportedOf(v, f.id, f.digest)
			if err != nil {
				return engine.Unavailable(err)
			}
			if !ok {
				continue
			}
			if err := fn(e); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// recordOfKey reads the tenant and the key's digest from a record's Redis key in any
// layout; ok is false for every other key.
func recordOfKey(k string) (tenant string, digest [32]byte, ok bool) {
	switch {
	case isRecordKey(k):
		tenant = k[len("idem:") : len(k)-65]
		b, err := hex.DecodeString(k[len(k)-64:])
		if err != nil {
			return "", digest, false
		}
		return tenant, [32]byte(b), true
	case isLeanKey(k):
		return k[4 : len(k)-33], [32]byte([]byte(k[len(k)-32:])), true
	}
	return "", digest, false
}

// exportedOf reads the export script's answer.
func exportedOf(v []any, id engine.ID, digest [32]byte) (engine.Exported, bool, error) {
	if len(v) < 2 {
		return engine.Exported{}, false, fmt.Errorf("malformed export answer of %d fields", len(v))
	}
	if status, _ := v[0].(string); status != "ok" {
		return engine.Exported{}, false, nil
	}
	if len(v) != 22 {
		return engine.Exported{}, false, fmt.Errorf("malformed export answer of %d fields", len(v))
	}
	f := v[2:]
	id.Key = str(f[0])
	if id.Key != "" && engine.KeyDigest(id.Key) != digest {
		// A key kept beside the record is the one it was claimed with; anything else
		// says the record is not what its Redis key says.
		return engine.Exported{}, false, fmt.Errorf("record of tenant %s keeps a key whose digest is not its Redis key's", id.Tenant)
	}
	e := engine.Exported{KeyDigest: digest}
	e.ID = id
	e.State = decodeState(str(f[2]))
	e.Fingerprint = expand(str(f[3]))
	e.Owner = str(f[4])
	e.Attempt = integer(f[5])
	e.LeaseToken = expand(str(f[6]))
	if e.State == engine.StatePending {
		e.LeaseExpiresAt = msTime(f[7])
	}
	e.Recovered = str(f[8]) == "1"
	e.CreatedAt, e.UpdatedAt, e.ExpiresAt = msTime(f[9]), msTime(f[10]), msTime(f[11])
	if status := integer(f[12]); status != 0 {
		headers, err := unpackHeaders(str(f[13]))
		if err != nil {
			return engine.Exported{}, false, err
		}
		e.Response = &engine.Response{Status: int(status), Headers: headers, Body: []byte(str(f[14]))}
	}
	e.Secret = expand(str(f[15]))
	if at := integer(f[19]); at != 0 {
		e.RecoveryPoint = &engine.RecoveryPoint{Name: str(f[16]), Attempt: integer(f[18]), RecordedAt: msTime(f[19])}
		if data := str(f[17]); data != "" {
			e.RecoveryPoint.Data = []byte(data)
		}
	}
	return e, true, nil
}

// stateLetter is how the scripts keep a state.
func stateLetter(s engine.State) string {
	switch s {
	case engine.StatePending:
		return "p"
	case engine.StateReleased:
		return "r"
	case engine.StateCompleted:
		return "c"
	case engine.StateFailed:
		return "f"
	}
	return ""
}

// Import implements engine.Porter with the import script, in the store's layout.
func (s *Store) Import(ctx context.Context, e engine.Exported) (engine.ImportOutcome, error) {
	l, err := s.current(ctx)
	if err != nil {
		return "", err
	}
	keys, args, err := importArgs(l, e)
	if err != nil {
		return "", err
	}
	rep, err := s.runKeys(ctx, l.scripts.importRecord, keys, e.ID, args...)
	if err != nil {
		return "", err
	}
	return s.imported(rep, e, keys)
}

// ImportBatch implements engine.BatchImporter: the import script for every record, in
// one pipeline (on a Cluster, one to each master, at once).
func (s *Store) ImportBatch(ctx context.Context, es []engine.Exported) []engine.Imported {
	out := make([]engine.Imported, len(es))
	l, err := s.current(ctx)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	calls := make([]*call, 0, len(es))
	at := make([]int, 0, len(es))
	tenants := make(map[string]int)
	for i, e := range es {
		keys, args, err := importArgs(l, e)
		if err != nil {
			out[i].Err = err
			continue
		}
		if _, ok := tenants[e.ID.Tenant]; !ok {
			// A usage read of the tenant that begins meanwhile waits for these writes'
			// counts, as for one import.
			tenants[e.ID.Tenant] = s.usage.writing(e.ID.Tenant)
		}
		calls = append(calls, &call{ctx: ctx, script: l.scripts.importRecord, keys: keys, args: args, done: make(chan struct{})})
		at = append(at, i)
	}
	defer func() {
		for tenant, epoch := range tenants {
			s.usage.wrote(tenant, epoch)
		}
	}()
	if len(calls) > 0 {
		s.pipe.doAll(ctx, calls)
	}
	for j, c := range calls {
		i := at[j]
		rep, err := s.scriptReply(ctx, c.val, c.err, es[i].ID)
		if err == nil {
			out[i].Outcome, err = s.imported(rep, es[i], c.keys)
		}
		out[i].Err = err
	}
	return out
}

// importArgs are the import script's keys and arguments for e.
func importArgs(l *layoutState, e engine.Exported) ([]string, []any, error) {
	if e.ID.Key != "" && engine.KeyDigest(e.ID.Key) != e.KeyDigest {
		return nil, nil, errors.New("redisstore: the record's key does not match its digest")
	}
	st := stateLetter(e.State)
	if st == "" {
		return nil, nil, fmt.Errorf("redisstore: no state %q", e.State)
	}
	var err error
	token := e.LeaseToken
	if token == "" {
		token = engine.NewLeaseToken()
	}
	msOf := func(t interface{ UnixMilli() int64 }, zero bool) string {
		if zero {
			return ""
		}
		return strconv.FormatInt(t.UnixMilli(), 10)
	}
	status, body, headers, packed := "", []byte(nil), "", ""
	if r := e.Response; r != nil {
		if headers, err = encodeHeaders(r.Headers); err != nil {
			return nil, nil, err
		}
		if packed, err = l.packHeaders(r.Headers); err != nil {
			return nil, nil, err
		}
		status, body = strconv.Itoa(r.Status), r.Body
	}
	pn, pd, pa, pt := "", []byte(nil), "", ""
	if p := e.RecoveryPoint; p != nil {
		pn, pd, pa, pt = p.Name, p.Data, strconv.FormatInt(p.Attempt, 10), msOf(p.RecordedAt, false)
	}
	rec := ""
	if e.Recovered {
		rec = "1"
	} else {
		rec = "0"
	}
	return scriptKeys(e.ID.Tenant, e.KeyDigest), []any{
		e.ID.Key, e.ID.Tenant, st, e.Owner, strconv.FormatInt(e.Attempt, 10),
		msOf(e.LeaseExpiresAt, e.State != engine.StatePending || e.LeaseExpiresAt.IsZero()), rec,
		msOf(e.CreatedAt, false), msOf(e.UpdatedAt, false), msOf(e.ExpiresAt, false),
		status, body, pn, pd, pa, pt,
		e.Fingerprint, token, e.Secret, headers,
		l.compact(e.Fingerprint), l.compact(token), l.compact(e.Secret), packed}, nil
}

// imported is what the import script's answer rep says it did with e.
func (s *Store) imported(rep reply, e engine.Exported, keys []string) (engine.ImportOutcome, error) {
	switch rep.status {
	case "ok":
		if e.State == engine.StatePending && !e.LeaseExpiresAt.IsZero() {
			s.noteDue(e.ID.Tenant, slot(keys[0]), e.LeaseExpiresAt)
		}
		return engine.ImportWritten, nil
	case "expired":
		return engine.ImportExpired, nil
	case "exists":
		if engine.SameRecord(rep.record, e.Record) {
			return engine.ImportSame, nil
		}
		return engine.ImportKept, nil
	}
	return "", rep.unexpected()
}

// Daemons counts the connections to the store's masters that name themselves
// DaemonClientName, alone or followed by an instance: those of idemd daemons of the
// release before this one or later (earlier ones named none). A copy between stores refuses to run while there are any.
func (s *Store) Daemons(ctx context.Context) (int, error) {
	var mu sync.Mutex
	var n int
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		list, err := m.ClientList(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLIENT LIST on %s: %w", m.Options().Addr, err)
		}
		found := 0
		for _, line := range strings.Split(list, "\n") {
			for _, field := range strings.Fields(line) {
				if base, _, ok := daemonName(strings.TrimPrefix(field, "name=")); field == "name="+DaemonClientName ||
					strings.HasPrefix(field, "name=") && ok && base == DaemonClientName {
					found++
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		n += found
		return nil
	})
	if err != nil {
		return 0, engine.Unavailable(err)
	}
	return n, nil
}

// Records is about how many records the store holds: the keys of every master
// (DBSIZE), less nothing, so that the pending indexes and the layout key count too.
func (s *Store) Records(ctx context.Context) (int64, error) {
	var mu sync.Mutex
	var n int64
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		size, err := m.DBSize(ctx).Result()
		if err != nil {
			return fmt.Errorf("DBSIZE on %s: %w", m.Options().Addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		n += size
		return nil
	})
	if err != nil {
		return 0, engine.Unavailable(err)
	}
	return n, nil
}
