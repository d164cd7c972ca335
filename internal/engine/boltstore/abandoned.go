package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

// bucketPending indexes the pending records for the abandoned-keys feed: one entry per
// pending record, keyed by the tenant's length and name then the client's key (so that
// a tenant's keys sort together, in key order, and a prefix is a range), holding what
// the feed shows (pendingEntry). A record leaves it when it stops being pending.
var bucketPending = []byte("pending")

// maxPendingScan bounds the index entries one page of the feed reads, so that a tenant
// with many live leases under a prefix answers in bounded time; the page then ends
// early with a cursor.
const maxPendingScan = 10000

func pendingKey(tenant, key string) []byte {
	k := make([]byte, 0, 1+len(tenant)+len(key))
	k = append(k, byte(len(tenant)))
	k = append(k, tenant...)
	return append(k, key...)
}

// pendingEntry is a pending index entry's value: what the feed shows of the key, so
// that a page reads the index alone, never the records (whose tree is as deep as all
// the records make it).
type pendingEntry struct {
	LeaseExpiry int64  `json:"lx"`
	Expires     int64  `json:"xa"`
	Attempt     int64  `json:"at"`
	Fingerprint string `json:"fp,omitempty"`
	Owner       string `json:"ow,omitempty"`
	Point       string `json:"pn,omitempty"`
}

func encodePending(r *stored) ([]byte, error) {
	return json.Marshal(pendingEntry{LeaseExpiry: r.LeaseExpiry, Expires: r.Expires, Attempt: r.Attempt, Fingerprint: r.Fingerprint,
		Owner: r.Owner, Point: r.PointName})
}

// index keeps r's entry in the pending index as its state says.
func (t *txn) index(r *stored) error {
	if r.Key == "" {
		// Imported from a store that kept only the key's digest: the feed cannot name
		// it until a transition has named it.
		return nil
	}
	b := t.tx.Bucket(bucketPending)
	pk := pendingKey(r.Tenant, r.Key)
	if r.State != engine.StatePending {
		return b.Delete(pk)
	}
	v, err := encodePending(r)
	if err != nil {
		return err
	}
	return b.Put(pk, v)
}

// indexPending fills the pending index from the records, once, for a database written
// before it existed.
func indexPending(tx *bolt.Tx) error {
	if tx.Bucket(bucketPending) != nil {
		return nil
	}
	b, err := tx.CreateBucket(bucketPending)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRecords).ForEach(func(_, v []byte) error {
		var r stored
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("record is corrupt: %w", err)
		}
		if r.State != engine.StatePending {
			return nil
		}
		e, err := encodePending(&r)
		if err != nil {
			return err
		}
		return b.Put(pendingKey(r.Tenant, r.Key), e)
	})
}

// Abandoned implements engine.Store: the tenant's pending index in key order, from the
// prefix or past the cursor (the last key of the previous page). The index is written
// with its records and the sweeper removes expired records' entries, so it is read
// alone.
func (s *Store) Abandoned(ctx context.Context, q engine.AbandonedQuery) (engine.AbandonedPage, error) {
	if err := ctx.Err(); err != nil {
		return engine.AbandonedPage{}, err
	}
	if q.Cursor != "" && (len(q.Cursor) > engine.MaxKeyBytes || len(q.Cursor) < len(q.Prefix) || q.Cursor[:len(q.Prefix)] != q.Prefix) {
		return engine.AbandonedPage{}, engine.ErrBadCursor
	}
	before, now := q.Before.UnixMilli(), msTime(s.now().UnixMilli())
	from := pendingKey(q.Tenant, q.Prefix)
	prefix := bytes.Clone(from)
	if q.Cursor != "" {
		// Just past the cursor's key.
		from = append(pendingKey(q.Tenant, q.Cursor), 0)
	}
	var page engine.AbandonedPage
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketPending).Cursor()
		scanned, last := 0, ""
		for k, v := c.Seek(from); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			key := string(k[1+len(q.Tenant):])
			if scanned++; scanned > maxPendingScan {
				page.Next = last
				return nil
			}
			last = key
			var e pendingEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("pending index entry of %q is corrupt: %w", key, err)
			}
			// A record past its retention is absent, though the sweeper may not have
			// removed it and its entry yet.
			if e.LeaseExpiry > before || engine.Expired(msTime(e.Expires), now) {
				continue
			}
			page.Keys = append(page.Keys, engine.AbandonedKey{Key: key, Attempt: e.Attempt, Fingerprint: e.Fingerprint, Owner: e.Owner,
				LeaseExpiredAt: msTime(e.LeaseExpiry), Point: e.Point})
			if len(page.Keys) == q.Limit {
				// The next page starts past this key, if there is one.
				if k, _ := c.Next(); k != nil && bytes.HasPrefix(k, prefix) {
					page.Next = key
				}
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return engine.AbandonedPage{}, engine.Unavailable(err)
	}
	return page, nil
}
