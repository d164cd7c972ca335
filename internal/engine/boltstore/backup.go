package boltstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

// Backup writes a consistent copy of the database to w while the store serves: bbolt's
// own copy of one read transaction, which sees every transition committed before it
// began and none after. size is called first with the copy's length. The copy is a
// database file that Open takes as it is.
func (s *Store) Backup(ctx context.Context, w io.Writer, size func(int64)) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error {
		size(tx.Size())
		var err error
		n, err = tx.WriteTo(ctxWriter{ctx, w})
		return err
	})
	return n, err
}

// ctxWriter stops a copy whose caller went away.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// BackupStats is what Verify found in a copy.
type BackupStats struct {
	Records int64
	Bytes   int64
	SHA256  string
}

// Verify checks that the file at path is a whole database of idemd's: bbolt's check of
// every page, and the buckets the store keeps. It opens the file read-only.
func Verify(path string) (BackupStats, error) {
	var stats BackupStats
	f, err := os.Open(path)
	if err != nil {
		return stats, err
	}
	h := sha256.New()
	stats.Bytes, err = io.Copy(h, f)
	_ = f.Close()
	if err != nil {
		return stats, err
	}
	stats.SHA256 = hex.EncodeToString(h.Sum(nil))
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return stats, fmt.Errorf("%s is no database of idemd's: %w", path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		// The check's channel is read to its end: it runs on the transaction, which
		// must stay open until it is done.
		var damage error
		for err := range tx.Check() {
			if damage == nil {
				damage = fmt.Errorf("%s is damaged: %w", path, err)
			}
		}
		if damage != nil {
			return damage
		}
		records := tx.Bucket(bucketRecords)
		if records == nil || tx.Bucket(bucketExpiry) == nil {
			return fmt.Errorf("%s is a bbolt database, but not one of idemd's: it lacks the records", path)
		}
		stats.Records = int64(records.Stats().KeyN)
		return nil
	})
	return stats, err
}

// ErrDataExists says that a restore would replace a database.
var ErrDataExists = errors.New("the data directory holds a database already")

// Restore verifies the copy at backup and puts it in dataDir as the embedded store's
// database, for an idemd started afterwards. A database there is refused unless
// replace is set, and then kept beside it, renamed with the time; a database that an
// idemd holds open is always refused. The copy is synced before it takes its name, so
// that a crash leaves the old database or the whole copy.
func Restore(backup, dataDir string, replace bool) (BackupStats, error) {
	stats, err := Verify(backup)
	if err != nil {
		return stats, err
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return stats, err
	}
	target := filepath.Join(dataDir, DatabaseFile)
	if _, err := os.Stat(target); err == nil {
		if !replace {
			return stats, fmt.Errorf("%w: %s", ErrDataExists, target)
		}
		// The lock bbolt takes tells a database in use from one at rest.
		db, err := bolt.Open(target, 0o600, &bolt.Options{Timeout: 500 * time.Millisecond})
		if err != nil {
			return stats, fmt.Errorf("%s is in use (is an idemd running on it?): %w", target, err)
		}
		_ = db.Close()
		aside := target + ".before-restore-" + time.Now().UTC().Format("20060102T150405Z")
		if err := os.Rename(target, aside); err != nil {
			return stats, err
		}
	}
	src, err := os.Open(backup)
	if err != nil {
		return stats, err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dataDir, "."+DatabaseFile+".restore-*")
	if err != nil {
		return stats, err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		_ = tmp.Close()
		return stats, err
	}
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return stats, err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return stats, err
	}
	if err := tmp.Close(); err != nil {
		return stats, err
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return stats, err
	}
	dir, err := os.Open(dataDir)
	if err == nil {
		_ = dir.Sync()
		_ = dir.Close()
	}
	return stats, nil
}

// DatabaseFile is the database's name in a data directory.
const DatabaseFile = "idemd.db"

// BackupBlob is a result that a record of a copy keeps in the blob store.
type BackupBlob struct {
	ID        engine.ID
	Ref       engine.BlobRef
	ExpiresAt time.Time
}

// Blobs lists the results that the records of the database file at path keep in the
// blob store, in the order of the records' keys: those of the records live at now,
// which a daemon started on the file would answer. An expired record's is left out:
// that daemon sees no record, and its blob is the sweep's. It opens the file
// read-only.
func Blobs(path string, now time.Time) ([]BackupBlob, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("%s is no database of idemd's: %w", path, err)
	}
	defer db.Close()
	var blobs []BackupBlob
	err = db.View(func(tx *bolt.Tx) error {
		records := tx.Bucket(bucketRecords)
		if records == nil {
			return fmt.Errorf("%s is a bbolt database, but not one of idemd's: it lacks the records", path)
		}
		return records.ForEach(func(k, v []byte) error {
			if !bytes.Contains(v, blobMark) {
				return nil
			}
			var r stored
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("%s: a record is corrupt: %w", path, err)
			}
			if !r.State.Known() || !r.HasResponse || engine.Expired(msTime(r.Expires), now) {
				return nil
			}
			ref, ok := (&engine.Response{Headers: r.Headers}).Blob()
			if !ok {
				return nil
			}
			blobs = append(blobs, BackupBlob{ID: engine.ID{Tenant: r.Tenant, Key: r.Key}, Ref: ref, ExpiresAt: msTime(r.Expires)})
			return nil
		})
	})
	return blobs, err
}
