// Package blobdir keeps the blob store (engine.BlobStore) in a directory on local
// disk: one file per blob, written to a temporary file, synced and renamed into place,
// so that a name holds either nothing or every byte of its blob.
package blobdir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

// Store is a blob store in a directory.
type Store struct {
	dir string
}

// tmpSuffix marks a blob still being written; List skips them, and a sweep of names
// never sees one.
const tmpSuffix = ".tmp"

// staleTmp is how old a temporary file must be for Open to remove it: a write in
// flight is never that slow, so an older one was left by a process that died.
const staleTmp = time.Hour

// Open returns the store in dir, making it if need be, and removes the temporary files
// that writes cut short by a crash left behind.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blob directory: %w", err)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, "*", "*"+tmpSuffix))
	for _, tmp := range tmps {
		if fi, err := os.Stat(tmp); err == nil && time.Since(fi.ModTime()) > staleTmp {
			_ = os.Remove(tmp)
		}
	}
	return &Store{dir: dir}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// path is the file of a name; names are engine.BlobName's ("dir/file"), and any other
// that would leave the directory is refused.
func (s *Store) path(name string) (string, error) {
	if name == "" || !filepath.IsLocal(name) || strings.HasSuffix(name, tmpSuffix) {
		return "", fmt.Errorf("blob name %q is not one the store keeps", name)
	}
	return filepath.Join(s.dir, filepath.FromSlash(name)), nil
}

// Put writes the blob to a temporary file beside its place, syncs it and renames it
// into place, then syncs the directory.
func (s *Store) Put(ctx context.Context, name string, r io.Reader, size int64) (engine.BlobRef, error) {
	path, err := s.path(name)
	if err != nil {
		return engine.BlobRef{}, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return engine.BlobRef{}, engine.Unavailable(err)
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*"+tmpSuffix)
	if err != nil {
		return engine.BlobRef{}, engine.Unavailable(err)
	}
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	blob := engine.NewCheckedBlob(r, size)
	if _, err := io.Copy(f, ctxReader{ctx, blob}); err != nil {
		if errors.Is(err, engine.ErrBlobSize) || ctx.Err() != nil {
			return engine.BlobRef{}, err
		}
		return engine.BlobRef{}, engine.Unavailable(err)
	}
	if err := f.Sync(); err != nil {
		return engine.BlobRef{}, engine.Unavailable(err)
	}
	if err := f.Close(); err != nil {
		return engine.BlobRef{}, engine.Unavailable(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return engine.BlobRef{}, engine.Unavailable(err)
	}
	done = true
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		_ = d.Close()
		if err != nil {
			return engine.BlobRef{}, engine.Unavailable(err)
		}
	}
	return blob.Ref(name), nil
}

// ctxReader stops a copy once its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Get opens the blob's file.
func (s *Store) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	path, err := s.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, engine.ErrBlobNotFound
	case err != nil:
		return nil, engine.Unavailable(err)
	}
	return f, nil
}

// Delete removes the blob's file, and its directory once empty.
func (s *Store) Delete(ctx context.Context, name string) error {
	path, err := s.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return engine.Unavailable(err)
	}
	// Only an empty directory goes; one that holds another blob stays.
	if dir := filepath.Dir(path); dir != s.dir {
		_ = os.Remove(dir)
	}
	return nil
}

// List walks the directory in name order.
func (s *Store) List(ctx context.Context, after string, fn func(name string) bool) error {
	tops, err := os.ReadDir(s.dir)
	if err != nil {
		return engine.Unavailable(err)
	}
	for _, top := range tops {
		if !top.IsDir() {
			continue
		}
		if afterDir, _, _ := strings.Cut(after, "/"); top.Name() < afterDir {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(s.dir, top.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return engine.Unavailable(err)
		}
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			if e.Type().IsRegular() && !strings.HasSuffix(e.Name(), tmpSuffix) {
				names = append(names, top.Name()+"/"+e.Name())
			}
		}
		slices.Sort(names)
		for _, name := range names {
			if name <= after {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if !fn(name) {
				return nil
			}
		}
	}
	return nil
}
