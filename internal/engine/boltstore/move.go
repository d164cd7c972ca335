package boltstore

import (
	"context"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

// MoveOut implements engine.Mover.
func (s *Store) MoveOut(ctx context.Context, tenant string, digest [32]byte, key string, seal bool, until time.Time) (engine.MoveOutcome, *engine.Exported, error) {
	var outcome engine.MoveOutcome
	var kept *engine.Exported
	err := s.updateKey(ctx, digestKey(tenant, digest), func(t *txn, rk []byte) error {
		var err error
		outcome, kept, err = moveOut(t, rk, tenant, digest, key, seal, until)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	return outcome, kept, nil
}

// MoveOutBatch implements engine.BatchMover: MoveOut on every key, committed together.
func (s *Store) MoveOutBatch(ctx context.Context, keys []engine.MoveKey, seal bool, until time.Time) []engine.MovedOut {
	out := make([]engine.MovedOut, len(keys))
	errs := s.updateKeys(ctx, moveKeys(keys), func(i int, t *txn, rk []byte) error {
		var err error
		k := keys[i]
		out[i].Outcome, out[i].Record, err = moveOut(t, rk, k.Tenant, k.Digest, k.Key, seal, until)
		return err
	})
	for i, err := range errs {
		if err != nil {
			out[i] = engine.MovedOut{Err: err}
		}
	}
	return out
}

// moveKeys are the record keys of keys.
func moveKeys(keys []engine.MoveKey) [][]byte {
	rks := make([][]byte, len(keys))
	for i, k := range keys {
		rks[i] = digestKey(k.Tenant, k.Digest)
	}
	return rks
}

// moveOut is MoveOut's transition of the record at rk.
func moveOut(t *txn, rk []byte, tenant string, digest [32]byte, key string, seal bool, until time.Time) (engine.MoveOutcome, *engine.Exported, error) {
	var outcome engine.MoveOutcome
	var kept *engine.Exported
	err := func() error {
		r, err := t.get(rk)
		if err != nil {
			return err
		}
		switch {
		case r == nil && !seal:
			outcome = engine.MoveSealed
			return nil
		case r == nil:
			outcome = engine.MoveSealed
			t.to = engine.StateMoved
			return t.put(rk, &stored{Key: key, Tenant: tenant, State: engine.StateMoved, Created: t.now, Updated: t.now, Expires: until.UnixMilli()}, 0)
		case r.State == engine.StateMoved:
			outcome = engine.MoveSealed
			return nil
		case r.State == engine.StateMoving:
			outcome, kept = engine.MoveHandingOver, heldCopy(r, digest)
			return nil
		case !r.State.Known():
			return answerErr{engine.ErrStoreMoved}
		}
		if r.Key == "" {
			r.Key = key
		}
		outcome = engine.MoveHandingOver
		kept = &engine.Exported{Entry: *r.entry(), KeyDigest: digest}
		marker := *r
		marker.Held, marker.HeldExpires = r.State, r.Expires
		marker.State, marker.Expires = engine.StateMoving, until.UnixMilli()
		t.from, t.to, t.notify = r.State, engine.StateMoving, true
		return t.put(rk, &marker, r.Expires)
	}()
	return outcome, kept, err
}

// heldCopy is the record a moving marker keeps.
func heldCopy(r *stored, digest [32]byte) *engine.Exported {
	rec := *r
	rec.State, rec.Expires = r.Held, r.HeldExpires
	rec.Held, rec.HeldExpires = "", 0
	return &engine.Exported{Entry: *rec.entry(), KeyDigest: digest}
}

// ConfirmMoved implements engine.Mover.
func (s *Store) ConfirmMoved(ctx context.Context, tenant string, digest [32]byte, until time.Time) error {
	return s.updateKey(ctx, digestKey(tenant, digest), func(t *txn, rk []byte) error { return confirmMoved(t, rk, until) })
}

// ConfirmMovedBatch implements engine.BatchMover: ConfirmMoved on every key, committed
// together.
func (s *Store) ConfirmMovedBatch(ctx context.Context, keys []engine.MoveKey, until time.Time) []error {
	return s.updateKeys(ctx, moveKeys(keys), func(_ int, t *txn, rk []byte) error { return confirmMoved(t, rk, until) })
}

// confirmMoved is ConfirmMoved's transition of the record at rk.
func confirmMoved(t *txn, rk []byte, until time.Time) error {
	r, err := t.get(rk)
	if err != nil || r == nil || r.State != engine.StateMoving {
		return err
	}
	t.from, t.to = engine.StateMoving, engine.StateMoved
	return t.put(rk, &stored{Key: r.Key, Tenant: r.Tenant, State: engine.StateMoved, Created: r.Created, Updated: t.now,
		Expires: until.UnixMilli()}, r.Expires)
}

// UnmovedBatches implements engine.BatchMover: Unmoved's keys, a read transaction's
// batch at a time.
func (s *Store) UnmovedBatches(ctx context.Context, fn func([]engine.MoveKey) error) error {
	batch := make([]engine.MoveKey, 0, exportBatch)
	err := walkLive(ctx, s, func(r *stored, digest [32]byte) (engine.MoveKey, bool, error) {
		return engine.MoveKey{Tenant: r.Tenant, Digest: digest, Key: r.Key}, r.State != engine.StateMoved, nil
	}, func(k engine.MoveKey) error {
		if batch = append(batch, k); len(batch) < exportBatch {
			return nil
		}
		err := fn(batch)
		batch = batch[:0]
		return err
	})
	if err == nil && len(batch) > 0 {
		err = fn(batch)
	}
	return err
}

// Unmoved implements engine.Mover, a batch of records per read transaction, as Export.
func (s *Store) Unmoved(ctx context.Context, fn func(tenant string, digest [32]byte, key string) error) (int64, error) {
	type found struct {
		tenant, key string
		digest      [32]byte
	}
	var moved int64
	err := walkLive(ctx, s, func(r *stored, digest [32]byte) (found, bool, error) {
		if r.State == engine.StateMoved {
			moved++
			return found{}, false, nil
		}
		return found{tenant: r.Tenant, key: r.Key, digest: digest}, true, nil
	}, func(f found) error { return fn(f.tenant, f.digest, f.key) })
	return moved, err
}
