package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// do runs one of the live move's scripts on a record's keys and answers what it
// answered, Redis's refusal of a marker as engine.ErrStoreMoved.
func (s *Store) doMove(ctx context.Context, sc script, keys []string, args ...any) (any, error) {
	v, err := s.pipe.do(ctx, sc, keys, args)
	return s.moveAnswer(ctx, v, err)
}

// moveAnswer is what a live move's script answered, Redis's refusal of a marker as
// engine.ErrStoreMoved.
func (s *Store) moveAnswer(ctx context.Context, v any, err error) (any, error) {
	switch {
	case isMoved(err):
		return nil, engine.ErrStoreMoved
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("redis: %w", ctx.Err())
	case err != nil:
		s.reloadOnNetworkError(err)
		return nil, engine.Unavailable(err)
	}
	return v, nil
}

// MoveOut implements engine.Mover with the moveout script.
func (s *Store) MoveOut(ctx context.Context, tenant string, digest [32]byte, key string, seal bool, until time.Time) (engine.MoveOutcome, *engine.Exported, error) {
	l, err := s.current(ctx)
	if err != nil {
		return "", nil, err
	}
	v, err := s.doMove(ctx, l.scripts.moveOut, scriptKeys(tenant, digest), strconv.FormatInt(until.UnixMilli(), 10), key, tenant, flag(seal))
	if err != nil {
		return "", nil, err
	}
	return s.movedOut(tenant, digest, v)
}

// movedOut reads the moveout script's answer, and counts in the usage what it moved.
func (s *Store) movedOut(tenant string, digest [32]byte, v any) (engine.MoveOutcome, *engine.Exported, error) {
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return "", nil, engine.Unavailable(fmt.Errorf("malformed moveout answer %v", v))
	}
	// Where the script wrote, what it moved in the usage comes last: after the status
	// and time of a sealed key, after the export's fields of one handed over.
	if status, _ := a[0].(string); status == "moved" {
		if len(a) == 3 {
			s.count(tenant, a[2])
		}
		return engine.MoveSealed, nil, nil
	}
	if len(a) == 23 {
		s.count(tenant, a[22])
		a = a[:22]
	}
	e, ok, err := exportedOf(a, engine.ID{Tenant: tenant}, digest)
	if err != nil || !ok {
		return "", nil, engine.Unavailable(fmt.Errorf("malformed moveout answer: %v", err))
	}
	return engine.MoveHandingOver, &e, nil
}

// ConfirmMoved implements engine.Mover with the confirm script.
func (s *Store) ConfirmMoved(ctx context.Context, tenant string, digest [32]byte, until time.Time) error {
	l, err := s.current(ctx)
	if err != nil {
		return err
	}
	v, err := s.doMove(ctx, l.scripts.confirmMoved, scriptKeys(tenant, digest), strconv.FormatInt(until.UnixMilli(), 10))
	if confirmed, ok := v.([]any); ok && len(confirmed) == 2 {
		s.count(tenant, confirmed[1])
	}
	return err
}

// moveCalls makes a call of sc for each key, with args, for a batch.
func moveCalls(ctx context.Context, sc script, keys []engine.MoveKey, args func(k engine.MoveKey) []any) []*call {
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = &call{ctx: ctx, script: sc, keys: scriptKeys(k.Tenant, k.Digest), args: args(k), done: make(chan struct{})}
	}
	return calls
}

// MoveOutBatch implements engine.BatchMover: the moveout script on every key, in one
// pipeline (on a Cluster, one to each master, at once).
func (s *Store) MoveOutBatch(ctx context.Context, keys []engine.MoveKey, seal bool, until time.Time) []engine.MovedOut {
	out := make([]engine.MovedOut, len(keys))
	l, err := s.current(ctx)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	ms, sealing := strconv.FormatInt(until.UnixMilli(), 10), flag(seal)
	calls := moveCalls(ctx, l.scripts.moveOut, keys, func(k engine.MoveKey) []any { return []any{ms, k.Key, k.Tenant, sealing} })
	s.pipe.doAll(ctx, calls)
	for i, c := range calls {
		v, err := s.moveAnswer(ctx, c.val, c.err)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Outcome, out[i].Record, out[i].Err = s.movedOut(keys[i].Tenant, keys[i].Digest, v)
	}
	return out
}

// ConfirmMovedBatch implements engine.BatchMover: the confirm script on every key, in
// one pipeline (on a Cluster, one to each master, at once).
func (s *Store) ConfirmMovedBatch(ctx context.Context, keys []engine.MoveKey, until time.Time) []error {
	out := make([]error, len(keys))
	l, err := s.current(ctx)
	if err != nil {
		for i := range out {
			out[i] = err
		}
		return out
	}
	ms := strconv.FormatInt(until.UnixMilli(), 10)
	calls := moveCalls(ctx, l.scripts.confirmMoved, keys, func(engine.MoveKey) []any { return []any{ms} })
	s.pipe.doAll(ctx, calls)
	for i, c := range calls {
		v, err := s.moveAnswer(ctx, c.val, c.err)
		if confirmed, ok := v.([]any); ok && len(confirmed) == 2 {
			s.count(keys[i].Tenant, confirmed[1])
		}
		out[i] = err
	}
	return out
}

// UnmovedBatches implements engine.BatchMover: the record keys of each SCAN batch of
// every master, the masters in parallel, without reading the records: a key holding a
// moved marker is listed too (moveout answers it sealed, and writes nothing).
func (s *Store) UnmovedBatches(ctx context.Context, fn func([]engine.MoveKey) error) error {
	return s.eachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		var cursor uint64
		batch := make([]engine.MoveKey, 0, scanCount)
		for {
			keys, next, err := m.Scan(ctx, cursor, scanMatch, scanCount).Result()
			if err != nil {
				return engine.Unavailable(err)
			}
			batch = batch[:0]
			for _, k := range keys {
				if tenant, digest, ok := recordOfKey(k); ok {
					batch = append(batch, engine.MoveKey{Tenant: tenant, Digest: digest})
				}
			}
			if len(batch) > 0 {
				if err := fn(batch); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	})
}

// eachMaster runs fn on every master at once, and answers the first failure, which
// stops the others.
func (s *Store) eachMaster(ctx context.Context, fn func(ctx context.Context, m *redis.Client) error) error {
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(masters))
	var wg sync.WaitGroup
	for i, m := range masters {
		wg.Go(func() {
			if errs[i] = fn(ctx, m); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		// The failure that stopped the others, rather than their cancellation.
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return errors.Join(errs...)
}

// Unmoved implements engine.Mover: SCAN on every master, as Export, and the peek
// script on each record key. A record moving between the layouts' keys while the scan
// runs may be missed: run it on a settled layout (docs/operations.md).
func (s *Store) Unmoved(ctx context.Context, fn func(tenant string, digest [32]byte, key string) error) (int64, error) {
	l, err := s.current(ctx)
	if err != nil {
		return 0, err
	}
	// Masters are looked over in parallel, so that a Cluster's handovers reach all of
	// them at once; fn is called by one at a time.
	var moved atomic.Int64
	var fnMu sync.Mutex
	err = s.eachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return s.unmovedOn(ctx, l, m, &moved, &fnMu, fn)
	})
	return moved.Load(), err
}

// unmovedOn is Unmoved on one master.
func (s *Store) unmovedOn(ctx context.Context, l *layoutState, m *redis.Client, moved *atomic.Int64, fnMu *sync.Mutex,
	fn func(tenant string, digest [32]byte, key string) error) error {
	if err := l.scripts.peek.Load(ctx, m).Err(); err != nil {
		return engine.Unavailable(err)
	}
	var cursor uint64
	for {
		keys, next, err := m.Scan(ctx, cursor, scanMatch, scanCount).Result()
		if err != nil {
			return engine.Unavailable(err)
		}
		// The records of a SCAN batch are peeked at in one pipeline: a round trip for
		// each batch rather than each key.
		type peeked struct {
			tenant string
			digest [32]byte
			cmd    *redis.Cmd
		}
		var batch []peeked
		p := m.Pipeline()
		for _, k := range keys {
			tenant, digest, ok := recordOfKey(k)
			if !ok {
				continue
			}
			batch = append(batch, peeked{tenant, digest, l.scripts.peek.EvalSha(ctx, p, digestKeys(tenant, digest))})
		}
		if len(batch) > 0 {
			if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return engine.Unavailable(err)
			}
		}
		for _, b := range batch {
			v, err := b.cmd.Slice()
			if err != nil && !errors.Is(err, redis.Nil) {
				return engine.Unavailable(err)
			}
			if len(v) != 2 {
				continue
			}
			switch st, _ := v[0].(string); st {
			case "", "x":
				if st == "x" {
					moved.Add(1)
				}
				continue
			}
			key, _ := v[1].(string)
			fnMu.Lock()
			err = fn(b.tenant, b.digest, key)
			fnMu.Unlock()
			if err != nil {
				return err
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	return nil
}
