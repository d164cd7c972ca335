package boltstore

import (
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
)

// TestMarkers writes the markers of a live move straight into the file, as the move
// writes them (the record's fields kept, its state the marker's), and holds the store
// to refusing them.
func TestMarkers(t *testing.T) {
	t.Parallel()
	enginetest.RunMarkers(t, func(t *testing.T) engine.Store {
		s, err := Open(filepath.Join(t.TempDir(), "idemd.db"), Options{SweepInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, func(st engine.Store) enginetest.Markers {
		s := st.(*Store)
		return enginetest.Markers{
			Put: func(t *testing.T, id engine.ID, phase engine.State, expires time.Time) {
				t.Helper()
				err := s.db.Update(func(tx *bolt.Tx) error {
					tr := &txn{tx: tx, now: time.Now().UnixMilli()}
					rk := recordKey(id)
					r, err := readRecord(tx, rk)
					if err != nil {
						return err
					}
					marker := &stored{Key: id.Key, Tenant: id.Tenant, Attempt: 1, Created: tr.now, Updated: tr.now}
					if r != nil {
						if err := tr.remove(rk, r); err != nil {
							return err
						}
						marker = r
					}
					marker.State, marker.Expires = phase, expires.UnixMilli()
					return tr.put(rk, marker, 0)
				})
				if err != nil {
					t.Fatal(err)
				}
			},
			Raw: func(t *testing.T, id engine.ID) []byte {
				t.Helper()
				var raw []byte
				err := s.db.View(func(tx *bolt.Tx) error {
					rk := recordKey(id)
					raw = append(raw, tx.Bucket(bucketRecords).Get(rk)...)
					raw = append(raw, "|pending:"...)
					raw = append(raw, tx.Bucket(bucketPending).Get(pendingKey(id.Tenant, id.Key))...)
					c := tx.Bucket(bucketExpiry).Cursor()
					for k, _ := c.First(); k != nil; k, _ = c.Next() {
						if len(k) >= len(rk) && string(k[len(k)-len(rk):]) == string(rk) {
							raw = append(raw, "|expiry:"...)
							raw = append(raw, k...)
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				return raw
			},
		}
	})
}
