package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
	"time"
)

// BlobStore keeps large results by name beside the record store (docs/design.md,
// "Large results"). A record whose result went there keeps only a BlobRef; the blob
// lives as long as the record. Implementations: blobdir (a directory) and blobs3 (an
// S3 bucket). Every method answers within its context; a failure of the blob store
// itself (not an answer about a name) is ErrUnavailable.
type BlobStore interface {
	// Put stores size bytes read from r under name, replacing any blob of that name
	// only once all of them arrived, and answers their SHA-256 computed while they
	// streamed. A reader that yields more or fewer than size bytes stores nothing.
	Put(ctx context.Context, name string, r io.Reader, size int64) (BlobRef, error)
	// Get streams the blob; ErrBlobNotFound when there is none.
	Get(ctx context.Context, name string) (io.ReadCloser, error)
	// Delete removes the blob; a name with none is no error.
	Delete(ctx context.Context, name string) error
	// List calls fn with the names after after, in byte order, until fn answers false
	// or the names run out.
	List(ctx context.Context, after string, fn func(name string) bool) error
}

// ErrBlobNotFound answers a Get of a name the blob store holds nothing under.
var ErrBlobNotFound = errors.New("no blob of this name")

// ErrResultUnavailable says that a record's result is kept in the blob store and could
// not be read back whole and intact: missing, short, or not the bytes stored. The
// result is never answered in part or altered; the record itself is as it was.
var ErrResultUnavailable = errors.New("the stored result could not be read back intact from the blob store")

// BlobRef is what a record keeps of a result held in the blob store.
type BlobRef struct {
	Name string
	Size int64
	// SHA256 is the hex-encoded SHA-256 of the blob's bytes.
	SHA256 string
}

// BlobHeader is the header under which a record keeps the BlobRef of its response's
// body: "name size sha256". A response that carries it has an empty body of its own,
// and keeps its status and other headers (or the mark of a sealed envelope) inline.
// The HTTP layer refuses the name in a response a client sends.
const BlobHeader = "Idemd-Blob"

// String is the ref as BlobHeader holds it.
func (b BlobRef) String() string {
	return b.Name + " " + strconv.FormatInt(b.Size, 10) + " " + b.SHA256
}

// Blob is the BlobRef the response keeps of its body, if it keeps one.
func (r *Response) Blob() (BlobRef, bool) {
	if r == nil {
		return BlobRef{}, false
	}
	v, ok := r.Headers[BlobHeader]
	if !ok || len(v) != 1 {
		return BlobRef{}, false
	}
	f := strings.Fields(v[0])
	if len(f) != 3 {
		return BlobRef{Name: v[0]}, true
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		n = -1
	}
	return BlobRef{Name: f[0], Size: n, SHA256: f[2]}, true
}

// BlobName is the name the result of a key's attempt is kept under: when the record
// it belongs to expires (Unix seconds, fixed width, so that names sort by it and a
// sweep stops at the first still live), a hash of the tenant and key (which names
// neither), the attempt and a random part (so that two writes for the same attempt
// never share a name).
func BlobName(id ID, attempt int64, expiresAt time.Time) string {
	h := sha256.New()
	_, _ = io.WriteString(h, id.Tenant)
	_, _ = h.Write([]byte{0})
	_, _ = io.WriteString(h, id.Key)
	return fmt.Sprintf("%011d/%x-%d-%s", max(expiresAt.Unix(), 0), h.Sum(nil)[:16], attempt, NewLeaseToken()[:16])
}

// BlobExpiry is when the record a blob of this name belongs to expires, read from the
// name; false for a name BlobName did not make.
func BlobExpiry(name string) (time.Time, bool) {
	head, _, ok := strings.Cut(name, "/")
	if !ok || len(head) != 11 {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// HashingReader counts and hashes what is read through it: the stores compute a
// blob's SHA-256 while it streams.
type HashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

// NewHashingReader reads r.
func NewHashingReader(r io.Reader) *HashingReader {
	return &HashingReader{r: r, h: sha256.New()}
}

func (h *HashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// Size is how many bytes were read.
func (h *HashingReader) Size() int64 { return h.n }

// Sum is the hex-encoded SHA-256 of what was read.
func (h *HashingReader) Sum() string { return hex.EncodeToString(h.h.Sum(nil)) }

// ErrBlobSize says that a reader given to Put yielded a number of bytes other than the
// size it was given with.
var ErrBlobSize = errors.New("the blob's bytes are not as many as its size says")

// CheckedBlob reads r through a HashingReader and fails with ErrBlobSize unless r
// yields exactly size bytes.
type CheckedBlob struct {
	*HashingReader
	size int64
	err  error
}

// NewCheckedBlob reads r, which must yield exactly size bytes.
func NewCheckedBlob(r io.Reader, size int64) *CheckedBlob {
	return &CheckedBlob{HashingReader: NewHashingReader(io.LimitReader(r, size+1)), size: size}
}

func (c *CheckedBlob) Read(p []byte) (int, error) {
	n, err := c.HashingReader.Read(p)
	switch {
	case c.n > c.size:
		c.err = fmt.Errorf("%w: more than %d", ErrBlobSize, c.size)
		return n, c.err
	case err == io.EOF && c.n < c.size:
		c.err = fmt.Errorf("%w: %d of %d", ErrBlobSize, c.n, c.size)
		return n, c.err
	}
	return n, err
}

// Err is the ErrBlobSize the reader met, if it met one: a client library may wrap
// or replace the error Read returned.
func (c *CheckedBlob) Err() error { return c.err }

// Ref is the BlobRef of what was read, under name.
func (c *CheckedBlob) Ref(name string) BlobRef {
	return BlobRef{Name: name, Size: c.n, SHA256: c.Sum()}
}
