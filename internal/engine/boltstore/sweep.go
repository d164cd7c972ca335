package boltstore

import (
	"bytes"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

func (s *Store) sweepLoop() {
	defer s.swept.Done()
	tick := time.NewTicker(s.opts.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			// A failed sweep is retried at the next tick; the records it left are already
			// treated as absent.
			_, _ = s.Sweep()
		}
	}
}

// Sweep removes the records whose retention has passed, in transactions of at most
// SweepBatch deletions so that claims never wait long behind it, and returns how many
// it removed.
func (s *Store) Sweep() (int, error) {
	total := 0
	for {
		select {
		case <-s.stop:
			return total, nil
		default:
		}
		n, more, err := s.sweepBatch()
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

func (s *Store) sweepBatch() (removed int, more bool, err error) {
	var states []engine.State
	type drop struct {
		tenant string
		bytes  int64
	}
	var drops []drop
	err = s.db.Update(func(tx *bolt.Tx) error {
		removed, more, states, drops = 0, false, states[:0], drops[:0]
		now := s.now().UnixMilli()
		records, expiry, pending := tx.Bucket(bucketRecords), tx.Bucket(bucketExpiry), tx.Bucket(bucketPending)
		// Collect first, delete after: a bbolt cursor may skip a key after deleting.
		var due [][]byte
		c := expiry.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if int64(binary.BigEndian.Uint64(k[:8])) >= now {
				break
			}
			if len(due) == s.opts.SweepBatch {
				more = true
				break
			}
			due = append(due, bytes.Clone(k))
		}
		for _, k := range due {
			rk := k[8:]
			if v := records.Get(rk); v != nil {
				r, err := decodeHead(v)
				if err != nil {
					return err
				}
				st := r.State
				drops = append(drops, drop{r.Tenant, recordSize(rk, v)})
				if err := records.Delete(rk); err != nil {
					return err
				}
				if st == engine.StatePending {
					if err := pending.Delete(pendingKey(r.Tenant, r.Key)); err != nil {
						return err
					}
				}
				states = append(states, st)
			}
			if err := expiry.Delete(k); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	for _, st := range states {
		s.counts.move(st, "")
	}
	for _, d := range drops {
		s.usage.add(d.tenant, -1, -d.bytes)
	}
	s.metrics.swept.Add(float64(len(states)))
	return removed, more, nil
}
