package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

// recordSize is what a record counts against its tenant's quota: its key and encoded
// record in the records bucket, its entry in the expiry index (the time and the key
// again), and the size of the result it keeps in the blob store, if it keeps one. The
// pending index's entry of a pending record and bbolt's own page overhead are not
// counted.
func recordSize(rk, v []byte) int64 { return int64(len(v)+2*len(rk)+8) + blobSize(v) }

// blobMark is how an encoded record that keeps its result in the blob store shows it:
// the header's name as a key of rh. Only a record that holds it is decoded.
var blobMark = []byte(`"` + engine.BlobHeader + `":[`)

// blobSize is the size of the result the encoded record v keeps in the blob store, as
// its reference says; 0 when it keeps none.
func blobSize(v []byte) int64 {
	if !bytes.Contains(v, blobMark) {
		return 0
	}
	var r struct {
		Headers map[string][]string `json:"rh"`
	}
	if json.Unmarshal(v, &r) != nil {
		return 0
	}
	ref, ok := (&engine.Response{Headers: r.Headers}).Blob()
	if !ok || ref.Size < 0 {
		return 0
	}
	return ref.Size
}

// tenantUsage counts each tenant's records and bytes. It is loaded at open and moved
// after each commit, as stateCounts is; a record past its retention counts until the
// sweeper removes it, within SweepInterval.
type tenantUsage struct {
	mu sync.Mutex
	n  map[string]engine.Usage
}

func (u *tenantUsage) load(tx *bolt.Tx) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n = make(map[string]engine.Usage)
	return tx.Bucket(bucketRecords).ForEach(func(k, v []byte) error {
		u.addLocked(tenantOf(k), 1, recordSize(k, v))
		return nil
	})
}

func (u *tenantUsage) add(tenant string, records, bytes int64) {
	if records == 0 && bytes == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.addLocked(tenant, records, bytes)
}

func (u *tenantUsage) addLocked(tenant string, records, bytes int64) {
	n := u.n[tenant]
	n.Records += records
	n.Bytes += bytes
	if n.Records == 0 && n.Bytes == 0 {
		delete(u.n, tenant)
		return
	}
	u.n[tenant] = n
}

func (u *tenantUsage) get(tenant string) engine.Usage {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[tenant]
}

// tenantOf is the tenant of a record key (recordKey): its length, then its name.
func tenantOf(rk []byte) string {
	if len(rk) == 0 || int(rk[0]) >= len(rk) {
		return ""
	}
	return string(rk[1 : 1+int(rk[0])])
}

// nextDropScan bounds the expiry entries Usage reads looking for a tenant's earliest.
const nextDropScan = 10000

// Usage implements engine.UsageReader: the counts kept in memory, and the earliest
// expiry of the tenant's among the first expiry entries.
func (s *Store) Usage(ctx context.Context, tenant string) (engine.Usage, error) {
	if err := ctx.Err(); err != nil {
		return engine.Usage{}, err
	}
	u := s.usage.get(tenant)
	if u.Records == 0 {
		return u, nil
	}
	prefix := append([]byte{byte(len(tenant))}, tenant...)
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketExpiry).Cursor()
		i := 0
		for k, _ := c.First(); k != nil && i < nextDropScan; k, _ = c.Next() {
			if bytes.HasPrefix(k[8:], prefix) {
				u.NextDrop = time.UnixMilli(int64(binary.BigEndian.Uint64(k[:8]))).Add(s.opts.SweepInterval)
				return nil
			}
			i++
		}
		return nil
	})
	if err != nil {
		return engine.Usage{}, engine.Unavailable(err)
	}
	return u, nil
}

// Fill implements engine.FillReader: the database's pages in use (the file less its
// free pages) against Options.MaxSize or, without one, against what the file and the
// free space of its disk could hold.
func (s *Store) Fill(ctx context.Context) (engine.Fill, error) {
	if err := ctx.Err(); err != nil {
		return engine.Fill{}, err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return engine.Fill{}, engine.Unavailable(errors.New("the store is closed"))
	}
	info, err := os.Stat(s.path)
	if err != nil {
		return engine.Fill{}, engine.Unavailable(err)
	}
	used := info.Size() - int64(s.db.Stats().FreeAlloc)
	limit := s.opts.MaxSize
	if limit <= 0 {
		var fs syscall.Statfs_t
		if err := syscall.Statfs(filepath.Dir(s.path), &fs); err != nil {
			return engine.Fill{}, engine.Unavailable(err)
		}
		limit = info.Size() + int64(fs.Bavail)*int64(fs.Bsize)
	}
	return engine.Fill{Used: max(used, 0), Limit: limit}, nil
}
