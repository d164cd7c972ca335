package boltstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

// exportBatch bounds the records one read transaction of Export decodes: a long read
// transaction would keep bbolt from reusing the pages written meanwhile.
const exportBatch = 500

// Export implements engine.Porter: it walks the records in the order of their keys, a
// batch per read transaction, and hands each to fn outside the transaction.
func (s *Store) Export(ctx context.Context, fn func(engine.Exported) error) error {
	return walkLive(ctx, s, func(r *stored, digest [32]byte) (engine.Exported, bool, error) {
		if !r.State.Known() {
			// A marker: its record has moved, and a stream that left it out would say
			// the key is free.
			return engine.Exported{}, false, engine.ErrStoreMoved
		}
		return engine.Exported{Entry: *r.entry(), KeyDigest: digest}, true, nil
	}, fn)
}

// walkLive walks the live records in the order of their keys, at most exportBatch of
// them kept per read transaction: pick reads each record inside the transaction and
// says what to keep of it, and fn gets what was kept outside the transaction. An error
// of pick's ends the walk: engine.ErrStoreMoved as it is, any other as unavailable.
func walkLive[T any](ctx context.Context, s *Store, pick func(r *stored, digest [32]byte) (T, bool, error), fn func(T) error) error {
	var after []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch := make([]T, 0, exportBatch)
		var last []byte
		err := s.db.View(func(tx *bolt.Tx) error {
			now := s.now().UnixMilli()
			c := tx.Bucket(bucketRecords).Cursor()
			k, _ := c.First()
			if after != nil {
				k, _ = c.Seek(after)
				if k != nil && bytes.Equal(k, after) {
					k, _ = c.Next()
				}
			}
			for ; k != nil && len(batch) < exportBatch; k, _ = c.Next() {
				last = append(last[:0], k...)
				r, err := readLive(tx, k, now)
				if err != nil {
					return err
				}
				if r == nil || len(k) < sha256.Size {
					continue
				}
				var digest [32]byte
				copy(digest[:], k[len(k)-sha256.Size:])
				item, keep, err := pick(r, digest)
				if err != nil {
					return err
				}
				if keep {
					batch = append(batch, item)
				}
			}
			return nil
		})
		if errors.Is(err, engine.ErrStoreMoved) {
			return err
		}
		if err != nil {
			return engine.Unavailable(err)
		}
		for _, item := range batch {
			if err := fn(item); err != nil {
				return err
			}
		}
		if last == nil {
			return nil
		}
		after = last
	}
}

// Import implements engine.Porter.
func (s *Store) Import(ctx context.Context, e engine.Exported) (engine.ImportOutcome, error) {
	if e.ID.Key != "" && engine.KeyDigest(e.ID.Key) != e.KeyDigest {
		return "", errors.New("boltstore: the record's key does not match its digest")
	}
	var outcome engine.ImportOutcome
	err := s.updateKey(ctx, digestKey(e.ID.Tenant, e.KeyDigest), func(t *txn, rk []byte) (err error) {
		outcome, err = importRecord(t, rk, e)
		return err
	})
	if err != nil {
		// A call whose deadline ended may still be committed later, writing outcome
		// meanwhile: it is read only once the commit has answered.
		return "", err
	}
	return outcome, nil
}

// ImportBatch imports records as Import does, all in one write transaction of their
// own, and answers how many it wrote. It is the way to fill a store with many records
// at once, as the benchmarks at size do: records given in the order of their digests
// are written to the file's pages in order.
func (s *Store) ImportBatch(ctx context.Context, es []engine.Exported) (int, error) {
	for _, e := range es {
		if e.ID.Key != "" && engine.KeyDigest(e.ID.Key) != e.KeyDigest {
			return 0, errors.New("boltstore: the record's key does not match its digest")
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return 0, engine.Unavailable(errors.New("boltstore: closed"))
	}
	ts := make([]txn, len(es))
	written := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		now := s.now().UnixMilli()
		written = 0
		for i, e := range es {
			ts[i] = txn{tx: tx, now: now}
			out, err := importRecord(&ts[i], digestKey(e.ID.Tenant, e.KeyDigest), e)
			var answer answerErr
			if errors.As(err, &answer) {
				return answer.err
			}
			if err != nil {
				return err
			}
			if out == engine.ImportWritten {
				written++
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, t := range ts {
		s.counts.move(t.from, t.to)
		s.usage.add(t.tenant, t.records, t.bytes)
	}
	return written, nil
}

// importRecord writes e at rk unless the store holds a live record there.
func importRecord(t *txn, rk []byte, e engine.Exported) (engine.ImportOutcome, error) {
	r, err := t.get(rk)
	if err != nil {
		return "", err
	}
	switch {
	case r != nil && !r.State.Known():
		// A marker of a move out of this store: never written over.
		return "", answerErr{engine.ErrStoreMoved}
	case r != nil && engine.SameRecord(r.record(false), e.Record):
		return engine.ImportSame, nil
	case r != nil:
		return engine.ImportKept, nil
	case engine.Expired(e.ExpiresAt, time.UnixMilli(t.now)):
		return engine.ImportExpired, nil
	}
	entry := e.Entry
	if entry.LeaseToken == "" {
		entry.LeaseToken = engine.NewLeaseToken()
	}
	t.to = entry.State
	return engine.ImportWritten, t.put(rk, encode(entry), 0)
}

// digestKey is recordKey for a key known by its digest only.
func digestKey(tenant string, digest [32]byte) []byte {
	k := make([]byte, 0, 1+len(tenant)+len(digest))
	k = append(k, byte(len(tenant)))
	k = append(k, tenant...)
	return append(k, digest[:]...)
}

// Records is about how many records the store holds, expired ones not yet swept
// included: the counts it keeps by state, read without touching the file.
func (s *Store) Records(context.Context) (int64, error) {
	var n int64
	for _, st := range []engine.State{engine.StatePending, engine.StateReleased, engine.StateCompleted, engine.StateFailed} {
		n += s.counts.get(st)
	}
	return n, nil
}
