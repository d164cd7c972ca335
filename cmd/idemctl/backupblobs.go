package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
)

// A backup of the embedded store keeps beside its database copy FILE the blobs its
// records refer to, in FILE.blobs, laid out as the daemon's blob directory is (one
// file a result under <expiry>/), and lists each in FILE.sha256 after the database.
// The database is what vouches for them: each record's reference names its blob's
// size and SHA-256, and the database's digest covers the references.

// backupBlobs is the directory of the blobs of the backup FILE.
func backupBlobs(file string) string { return file + ".blobs" }

// blobPath is the file of a blob's name under dir; a name that would leave dir is
// refused.
func blobPath(dir, name string) (string, error) {
	if name == "" || !filepath.IsLocal(filepath.FromSlash(name)) {
		return "", fmt.Errorf("a record names the blob %q, which is no blob name of idemd's", name)
	}
	return filepath.Join(dir, filepath.FromSlash(name)), nil
}

// blobGone says that a blob a record of the copy refers to is no longer in the
// daemon's blob directory. A blob is deleted only after its record has left the store
// (a purge, or an expiry and the sweep's grace): the record left after the copy was
// taken.
type blobGone struct{ blob boltstore.BackupBlob }

func (e *blobGone) Error() string {
	return fmt.Sprintf("the blob %s of key %q (tenant %q) was deleted after the copy was taken", e.blob.Ref.Name, e.blob.ID.Key, e.blob.ID.Tenant)
}

// copyBlob copies the blob of b from the directory from to the directory to, synced,
// checked against the size and SHA-256 its record names as it streams. A blob missing
// from from is a *blobGone.
func copyBlob(b boltstore.BackupBlob, from, to string) error {
	src, err := blobPath(from, b.Ref.Name)
	if err != nil {
		return err
	}
	dst, err := blobPath(to, b.Ref.Name)
	if err != nil {
		return err
	}
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return &blobGone{b}
	}
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	h := engine.NewHashingReader(io.LimitReader(in, b.Ref.Size+1))
	_, err = io.Copy(out, h)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := matches(b, h, src); err != nil {
		return err
	}
	return os.Rename(out.Name(), dst)
}

// matches says whether what h read of file is the blob b's record names.
func matches(b boltstore.BackupBlob, h *engine.HashingReader, file string) error {
	switch {
	case h.Size() != b.Ref.Size:
		return fmt.Errorf("%s, the result of key %q (tenant %q), holds %d bytes where its record names %d", file, b.ID.Key, b.ID.Tenant, h.Size(), b.Ref.Size)
	case h.Sum() != b.Ref.SHA256:
		return fmt.Errorf("%s, the result of key %q (tenant %q), is not the bytes its record names (SHA-256 %s, not %s)", file, b.ID.Key, b.ID.Tenant, h.Sum(), b.Ref.SHA256)
	}
	return nil
}

// checkBlobs checks that dir holds the blob of every record of the database copy at
// path that is live now, each the size and SHA-256 its record names, and answers how
// many there are and their bytes. Records expired now are left out: a daemon started
// on the copy sees none of them.
func checkBlobs(path, dir string) (int, int64, error) {
	blobs, err := boltstore.Blobs(path, time.Now())
	if err != nil {
		return 0, 0, err
	}
	var bytes int64
	for _, b := range blobs {
		file, err := blobPath(dir, b.Ref.Name)
		if err != nil {
			return 0, 0, err
		}
		f, err := os.Open(file)
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, fmt.Errorf("%s: the result of key %q (tenant %q) is kept by reference as the blob %s, which %s does not hold: the backup is incomplete, and that key would answer 502 result_unavailable once restored",
				path, b.ID.Key, b.ID.Tenant, b.Ref.Name, dir)
		}
		if err != nil {
			return 0, 0, err
		}
		h := engine.NewHashingReader(io.LimitReader(f, b.Ref.Size+1))
		_, err = io.Copy(io.Discard, h)
		_ = f.Close()
		if err != nil {
			return 0, 0, err
		}
		if err := matches(b, h, file); err != nil {
			return 0, 0, fmt.Errorf("%w: it changed since the backup", err)
		}
		bytes += b.Ref.Size
	}
	return len(blobs), bytes, nil
}

// restoreBlobs copies the blobs of the records of the copy at path that are live now
// from the backup's dir into the daemon's blob directory to, each checked again as it
// streams and renamed into place once synced.
func restoreBlobs(path, dir, to string) (int, error) {
	blobs, err := boltstore.Blobs(path, time.Now())
	if err != nil {
		return 0, err
	}
	for _, b := range blobs {
		if err := copyBlob(b, dir, to); err != nil {
			var gone *blobGone
			if errors.As(err, &gone) {
				return 0, fmt.Errorf("%s holds no blob %s, the result of key %q (tenant %q)", dir, b.Ref.Name, b.ID.Key, b.ID.Tenant)
			}
			return 0, err
		}
	}
	if len(blobs) > 0 {
		if d, err := os.Open(to); err == nil {
			_ = d.Sync()
			_ = d.Close()
		}
	}
	return len(blobs), nil
}

// sha256Lines are the lines of FILE.sha256, in sha256sum's form, for the database
// copy file with the given digest and its blobs: `sha256sum -c FILE.sha256`, run in
// FILE's directory, checks them all.
func sha256Lines(file, digest string, blobs []boltstore.BackupBlob) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %s\n", digest, filepath.Base(file))
	for _, blob := range blobs {
		fmt.Fprintf(&b, "%s  %s/%s\n", blob.Ref.SHA256, filepath.Base(backupBlobs(file)), blob.Ref.Name)
	}
	return b.String()
}
