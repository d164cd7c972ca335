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
	})
	if err != nil {
		return "", nil, err
	}
	return outcome, kept, nil
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
	return s.updateKey(ctx, digestKey(tenant, digest), func(t *txn, rk []byte) error {
		r, err := t.get(rk)
		if err != nil || r == nil || r.State != engine.StateMoving {
			return err
		}
		t.from, t.to = engine.StateMoving, engine.StateMoved
		return t.put(rk, &stored{Key: r.Key, Tenant: r.Tenant, State: engine.StateMoved, Created: r.Created, Updated: t.now,
			Expires: until.UnixMilli()}, r.Expires)
	})
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
