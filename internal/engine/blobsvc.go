package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"time"
)

// This file is how the Service keeps large results in a BlobStore: a result over the
// threshold is written there first and the record keeps its BlobRef (under
// BlobHeader); a replay reads it back whole and checks its size and SHA-256, or
// answers ErrResultUnavailable; a purge deletes it; a sweep deletes the blobs whose
// records have expired.

// Defaults of the blob store (docs/sizing.md, "Large results").
const (
	// DefaultBlobThreshold is the stored size over which a result goes to the blob
	// store when there is one (docs/bench-stores.md, "Large results").
	DefaultBlobThreshold = 64 << 10
	// DefaultMaxBlobBytes bounds a result kept in the blob store.
	DefaultMaxBlobBytes = 64 << 20
	// DefaultBlobBodies bounds how many large bodies the daemon holds at once, being
	// written to the blob store or read back from it; more wait their turn.
	DefaultBlobBodies = 8
	// BlobSweepGrace is how long after its record's expiry a sweep waits before it
	// deletes a blob, by default: the daemon's clock and the store's may differ by that
	// much, and a blob's name takes its expiry from the moment the daemon names it,
	// before the write and the transition that give the record its own.
	BlobSweepGrace = 10 * time.Minute
	// blobTimeoutPerMiB is added to the store deadline for each MiB a blob call
	// carries, so that a large result on a slow link is not cut at the deadline of a
	// small store call.
	blobTimeoutPerMiB = 250 * time.Millisecond
)

// BlobOptions say how a Service uses its blob store.
type BlobOptions struct {
	// Threshold is the stored size (Response.Size) over which a result goes to the
	// blob store; DefaultBlobThreshold when zero.
	Threshold int
	// Bodies bounds the large bodies held at once; DefaultBlobBodies when zero.
	Bodies int
	// OnError, when set, is called with "put", "get", "verify", "delete" or "sweep"
	// at each failure of the blob store (the idemd_blob_errors_total metric).
	OnError func(op string)
	// SweepGrace is how long after its record's expiry SweepBlobs leaves a blob;
	// BlobSweepGrace when zero. It must cover the daemons' and the store's clocks'
	// difference and the longest a completion takes from naming its blob to storing
	// its record (see BlobNameLead).
	SweepGrace time.Duration
}

type blobs struct {
	store      BlobStore
	threshold  int
	bodies     chan struct{}
	onError    func(op string)
	sweepGrace time.Duration
}

// WithBlobs keeps results over o.Threshold in store.
func WithBlobs(store BlobStore, o BlobOptions) Option {
	return func(s *Service) {
		if store == nil {
			return
		}
		b := &blobs{store: store, threshold: o.Threshold, bodies: make(chan struct{}, max(o.Bodies, 0)), onError: o.OnError, sweepGrace: o.SweepGrace}
		if b.sweepGrace <= 0 {
			b.sweepGrace = BlobSweepGrace
		}
		if b.threshold <= 0 {
			b.threshold = DefaultBlobThreshold
		}
		if o.Bodies <= 0 {
			b.bodies = make(chan struct{}, DefaultBlobBodies)
		}
		if b.onError == nil {
			b.onError = func(string) {}
		}
		s.blobs = b
	}
}

// BlobStore is the Service's blob store, nil without one.
func (s *Service) BlobStore() BlobStore {
	if s.blobs == nil {
		return nil
	}
	return s.blobs.store
}

// blobTimeout bounds one blob call that carries size bytes.
func (s *Service) blobTimeout(size int64) time.Duration {
	return s.storeTimeout + time.Duration((size+(1<<20)-1)>>20)*blobTimeoutPerMiB
}

// BlobNameLead is how much earlier than its record's a blob's name may say the record
// expires, on one clock: the name is made before the blob is written (under the store
// deadline plus blobTimeoutPerMiB for each MiB, up to maxBlobBytes) and the transition
// stores the record (under the store deadline), and it counts whole seconds. A sweep's
// grace shorter than this (plus the clocks' difference) could delete the blob of a
// live record. It leaves out a wait for a place among the bodies held at once.
func BlobNameLead(storeTimeout time.Duration, maxBlobBytes int64) time.Duration {
	return 2*storeTimeout + time.Duration((maxBlobBytes+(1<<20)-1)>>20)*blobTimeoutPerMiB + time.Second
}

// hold takes one of the large bodies' places, until release is called.
func (b *blobs) hold(ctx context.Context) (release func(), err error) {
	select {
	case b.bodies <- struct{}{}:
		return func() { <-b.bodies }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// large says whether resp goes to the blob store.
func (b *blobs) large(resp *Response) bool {
	return resp != nil && b.largeSize(resp.Size()-len(resp.Body), int64(len(resp.Body)))
}

// largeSize says whether a response of headers bytes of headers and a body of body
// bytes goes to the blob store.
func (b *blobs) largeSize(headers int, body int64) bool {
	return b != nil && body > 0 && int64(headers)+body > int64(b.threshold)
}

// offload writes the body of a large response to the blob store for the key's current
// attempt and answers the response the record keeps in its place, and the name of
// the blob ("" when nothing was written). A key the token does not hold now is
// answered with the body left out, unwritten: the store's transition refuses it (or
// answers the repeat of a completion already stored) without needing it. body, when
// set, is resp's body streamed (size bytes), read only once the lease is seen held.
func (s *Service) offload(ctx context.Context, id ID, token string, resp *Response, body io.Reader, size int64, retention time.Duration) (*Response, string, error) {
	rec, err := bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Lookup(ctx, id) })
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, "", err
	}
	if err != nil || rec.LeaseToken != token || rec.State != StatePending {
		return &Response{Status: resp.Status, Headers: maps.Clone(resp.Headers)}, "", nil
	}
	name := BlobName(id, rec.Attempt, time.Now().Add(retention))
	kept, err := s.putBlob(ctx, name, resp, body, size)
	if err != nil {
		return nil, "", err
	}
	return kept, name, nil
}

// putBlob writes the body of resp to the blob store under name and answers the
// response a record keeps in its place: resp without its body, with the reference
// under BlobHeader. body, when set, is that body streamed (size bytes), and a failure
// to read it is the sender's, not the blob store's. A streamed body is never held
// whole, yet it takes one of hold's places all the same, before its first byte is
// read: the places bound the writes the blob store serves at once, and a body waiting
// its turn stays in its connection. Its write arrives at the sender's pace, which the
// server's body deadline bounds, so the blob store's deadline runs from the last
// bytes it took rather than from the start: a store that stops taking them, or stops
// answering once it has them all, fails the write as a held body's would.
func (s *Service) putBlob(ctx context.Context, name string, resp *Response, body io.Reader, size int64) (*Response, error) {
	kept := &Response{Status: resp.Status, Headers: maps.Clone(resp.Headers)}
	release, err := s.blobs.hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var ref BlobRef
	var src *sourceReader
	if body == nil {
		ref, err = boundedFor(s.blobTimeout(int64(len(resp.Body))), ctx, func(ctx context.Context) (BlobRef, error) {
			return s.blobs.store.Put(ctx, name, bytes.NewReader(resp.Body), int64(len(resp.Body)))
		})
	} else {
		timeout := s.blobTimeout(size)
		putCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		idle := time.AfterFunc(timeout, cancel)
		defer idle.Stop()
		src = &sourceReader{r: body, progress: func() { idle.Reset(timeout) }}
		ref, err = s.blobs.store.Put(putCtx, name, src, size)
		switch {
		case err == nil || src.err != nil:
		case ctx.Err() != nil:
			err = ctx.Err()
		case putCtx.Err() != nil:
			err = &StoreTimeoutError{Timeout: timeout, cause: err}
		}
	}
	if err != nil {
		if src != nil && src.err != nil {
			err = src.err
		} else if ctx.Err() == nil {
			s.blobs.onError("put")
		}
		// A write cut short leaves no blob under the name, but one that failed after
		// the bytes arrived might: delete it, without holding the answer for it (a
		// blob store past its deadline would hold it for another deadline). No record
		// refers to the name; a delete that fails leaves it to the sweep.
		go s.dropBlob(name)
		return nil, err
	}
	if kept.Headers == nil {
		kept.Headers = map[string][]string{}
	}
	kept.Headers[BlobHeader] = []string{ref.String()}
	return kept, nil
}

// exportResult puts back, in a record about to leave in the record stream, the result
// it keeps in the blob store, read whole and checked: the stream carries every result
// inline, as any body, and needs no blob store to be read. A result that cannot be
// read back intact ends the export with ErrResultUnavailable.
func (s *Service) exportResult(ctx context.Context, e *Exported) error {
	if _, ok := e.Response.Blob(); !ok {
		return nil
	}
	if err := s.resolve(ctx, &e.Record); err != nil {
		return fmt.Errorf("export of a record of tenant %q: %w", e.ID.Tenant, err)
	}
	return nil
}

// importResult writes the result of a record arriving from the record stream to the
// blob store when it is over the threshold, as a completion's would be, and answers
// the name of the blob ("" when nothing was written); e then keeps the reference.
func (s *Service) importResult(ctx context.Context, e *Exported) (string, error) {
	if !s.blobs.large(e.Response) || !e.ExpiresAt.After(time.Now()) {
		return "", nil
	}
	if _, ok := e.Response.Blob(); ok {
		return "", nil
	}
	name := BlobName(e.ID, e.Attempt, e.ExpiresAt)
	kept, err := s.putBlob(ctx, name, e.Response, nil, 0)
	if err != nil {
		return "", err
	}
	e.Response = kept
	return name, nil
}

// sourceReader keeps the error its reader answered other than io.EOF: a body that
// could not be read (the sender hung up, sent too little, or too slowly) is told
// apart from a blob store that could not write it.
// progress is called after each read that gave bytes.
type sourceReader struct {
	r        io.Reader
	progress func()
	err      error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.progress()
	}
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// dropBlob deletes a blob the daemon wrote, under a deadline of its own: the
// request's context may have ended. A blob it fails to delete is the sweep's.
func (s *Service) dropBlob(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.storeTimeout)
	defer cancel()
	if err := s.blobs.store.Delete(ctx, name); err != nil {
		s.blobs.onError("delete")
	}
}

// settleBlob decides the fate of the blob a transition that answered err was given: kept
// when the record refers to it, deleted when the transition was refused. When the
// store gave no answer, the record is read once more: the blob stays if the write
// took effect, or when that cannot be told (the sweep deletes it with the record).
func (s *Service) settleBlob(id ID, name string, err error) {
	if name == "" || err == nil {
		return
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		ctx, cancel := context.WithTimeout(context.Background(), s.storeTimeout)
		defer cancel()
		rec, lerr := s.store.Lookup(ctx, id)
		if lerr != nil && !errors.Is(lerr, ErrNotFound) {
			return
		}
		if ref, ok := rec.Response.Blob(); lerr == nil && ok && ref.Name == name {
			return
		}
	}
	s.dropBlob(name)
}

// ResultError is a result kept in the blob store that could not be read back intact.
// It is ErrResultUnavailable.
type ResultError struct {
	Ref   BlobRef
	cause error
}

func (e *ResultError) Error() string {
	return fmt.Sprintf("%v: %v", ErrResultUnavailable, e.cause)
}

// Is makes errors.Is(err, ErrResultUnavailable) true.
func (e *ResultError) Is(target error) bool { return target == ErrResultUnavailable }

// Unwrap is the cause.
func (e *ResultError) Unwrap() error { return e.cause }

// resolve puts the body a record keeps in the blob store back in its response, read
// whole and checked against its size and SHA-256.
func (s *Service) resolve(ctx context.Context, rec *Record) error {
	ref, ok := rec.Response.Blob()
	if !ok {
		return nil
	}
	if s.blobs == nil {
		return &ResultError{Ref: ref, cause: errors.New("the daemon has no blob store (--blob-store)")}
	}
	release, err := s.blobs.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	body, err := boundedFor(s.blobTimeout(ref.Size), ctx, func(ctx context.Context) ([]byte, error) {
		return s.readBlob(ctx, ref)
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrResultUnavailable) {
			s.blobs.onError("verify")
			return err
		}
		s.blobs.onError("get")
		if errors.Is(err, ErrBlobNotFound) {
			return &ResultError{Ref: ref, cause: err}
		}
		return err
	}
	resp := *rec.Response
	resp.Headers = maps.Clone(resp.Headers)
	delete(resp.Headers, BlobHeader)
	if len(resp.Headers) == 0 {
		resp.Headers = nil
	}
	resp.Body = body
	rec.Response = &resp
	return nil
}

// readBlob reads the blob of ref whole, and answers a *ResultError unless it is ref's
// size and SHA-256.
func (s *Service) readBlob(ctx context.Context, ref BlobRef) ([]byte, error) {
	if ref.Size < 0 || len(ref.SHA256) != sha256.Size*2 {
		return nil, &ResultError{Ref: ref, cause: errors.New("the record's reference to its blob is malformed")}
	}
	r, err := s.blobs.store.Get(ctx, ref.Name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	body := make([]byte, 0, ref.Size)
	buf := bytes.NewBuffer(body)
	h := NewHashingReader(io.LimitReader(r, ref.Size+1))
	if _, err := buf.ReadFrom(h); err != nil {
		return nil, err
	}
	switch {
	case h.Size() != ref.Size:
		return nil, &ResultError{Ref: ref, cause: fmt.Errorf("the blob holds %d bytes, not %d", h.Size(), ref.Size)}
	case h.Sum() != ref.SHA256:
		return nil, &ResultError{Ref: ref, cause: errors.New("the blob's SHA-256 is not the one stored")}
	}
	return buf.Bytes(), nil
}

// LookupResult returns a record as Lookup does, except that a result kept in the blob
// store is left there: the record's response comes without its body and without
// BlobHeader, and the body is answered as a ResultBody to stream, which the caller
// closes (nil for a result the record holds). A blob missing, or of another size than
// its reference says when the blob store tells the size before the bytes, is
// ErrResultUnavailable before a byte is read. A streamed body takes none of the places
// hold keeps for bodies held whole: it holds only what its reader is given.
func (s *Service) LookupResult(ctx context.Context, id ID) (Record, *ResultBody, error) {
	rec, err := bounded(s, ctx, func(ctx context.Context) (Record, error) { return s.store.Lookup(ctx, id) })
	if err != nil {
		return Record{}, nil, err
	}
	ref, ok := rec.Response.Blob()
	if !ok {
		return rec, nil, nil
	}
	body, err := s.openBlob(ctx, ref)
	if err != nil {
		return Record{}, nil, err
	}
	resp := *rec.Response
	resp.Headers = maps.Clone(resp.Headers)
	delete(resp.Headers, BlobHeader)
	if len(resp.Headers) == 0 {
		resp.Headers = nil
	}
	rec.Response = &resp
	return rec, body, nil
}

// openBlob opens the blob of ref to stream, under a deadline for its size that runs
// from the last bytes read: the stream goes at its reader's pace, which the server's
// write deadline bounds, and a blob store that stops giving bytes still fails it.
func (s *Service) openBlob(ctx context.Context, ref BlobRef) (*ResultBody, error) {
	if s.blobs == nil {
		return nil, &ResultError{Ref: ref, cause: errors.New("the daemon has no blob store (--blob-store)")}
	}
	if ref.Size < 0 || len(ref.SHA256) != sha256.Size*2 {
		s.blobs.onError("verify")
		return nil, &ResultError{Ref: ref, cause: errors.New("the record's reference to its blob is malformed")}
	}
	timeout := s.blobTimeout(ref.Size)
	callCtx, cancelCall := context.WithCancel(ctx)
	idle := time.AfterFunc(timeout, cancelCall)
	cancel := func() { idle.Stop(); cancelCall() }
	r, err := s.blobs.store.Get(callCtx, ref.Name)
	if err != nil {
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, ErrBlobNotFound):
			s.blobs.onError("get")
			return nil, &ResultError{Ref: ref, cause: err}
		case callCtx.Err() != nil:
			s.blobs.onError("get")
			return nil, &StoreTimeoutError{Timeout: timeout, cause: err}
		}
		s.blobs.onError("get")
		return nil, err
	}
	if n, ok := BlobSize(r); ok && n != ref.Size {
		_ = r.Close()
		cancel()
		s.blobs.onError("verify")
		return nil, &ResultError{Ref: ref, cause: fmt.Errorf("the blob holds %d bytes, not %d", n, ref.Size)}
	}
	return &ResultBody{ctx: ctx, ref: ref, src: r, h: NewHashingReader(io.LimitReader(r, ref.Size+1)),
		progress: func() { idle.Reset(timeout) }, cancel: cancel, onError: s.blobs.onError}, nil
}

// BlobSize is the size of the blob r reads, when r can tell it before its bytes: a
// file can, and so can a reader with a Size method. A wrapper of a blob store's
// reader keeps the size known so (a Size method) where its reader had it.
func BlobSize(r io.Reader) (int64, bool) {
	switch r := r.(type) {
	case interface{ Size() int64 }:
		return r.Size(), true
	case interface{ Stat() (fs.FileInfo, error) }:
		if fi, err := r.Stat(); err == nil && fi.Mode().IsRegular() {
			return fi.Size(), true
		}
	}
	return 0, false
}

// ResultBody streams the body of a result kept in the blob store and checks it
// against its reference as it goes. It keeps the body's last byte back until it has
// read the whole blob and found its size and SHA-256 right: a reader that meets an
// error instead (a *ResultError for a blob that is not the one stored) has been given
// less than the whole body, so a receiver told the body's length (Size) never takes
// what it got for the result.
type ResultBody struct {
	// ctx is the caller's: a failure once it ended is not the blob store's.
	ctx context.Context
	ref BlobRef
	src io.ReadCloser
	h   *HashingReader
	// progress is called after each read that gave bytes; cancel ends the stream.
	progress func()
	cancel   func()
	onError  func(op string)
	read     int64
	// last is the body's last byte, kept back from the reader until the whole is
	// checked; lastRead says it was read from the blob.
	last     [1]byte
	lastRead bool
	err      error
}

// Size is the body's length in bytes.
func (b *ResultBody) Size() int64 { return b.ref.Size }

// Err is the error the body met, other than its end: a *ResultError, or the blob
// store's failure to read it.
func (b *ResultBody) Err() error {
	if b.err == io.EOF {
		return nil
	}
	return b.err
}

func (b *ResultBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if left := b.ref.Size - b.read; left > 1 {
		n, err := b.h.Read(p[:min(int64(len(p)), left-1)])
		b.read += int64(n)
		if n > 0 {
			b.progress()
		}
		switch {
		case err == io.EOF:
			return n, b.fail("verify", fmt.Errorf("the blob holds %d bytes, not %d", b.read, b.ref.Size))
		case err != nil:
			return n, b.fail("get", err)
		}
		return n, nil
	}
	held := b.read < b.ref.Size
	if held && !b.lastRead {
		if _, err := io.ReadFull(b.h, b.last[:]); err != nil {
			if err == io.EOF {
				return 0, b.fail("verify", fmt.Errorf("the blob holds %d bytes, not %d", b.read, b.ref.Size))
			}
			return 0, b.fail("get", err)
		}
		b.lastRead = true
	}
	var more [1]byte
	switch n, err := b.h.Read(more[:]); {
	case n > 0:
		return 0, b.fail("verify", fmt.Errorf("the blob holds more than %d bytes", b.ref.Size))
	case err == nil:
		// A reader may answer nothing and no error; the end is read on the next call.
		return 0, nil
	case err != io.EOF:
		return 0, b.fail("get", err)
	}
	if b.h.Sum() != b.ref.SHA256 {
		return 0, b.fail("verify", errors.New("the blob's SHA-256 is not the one stored"))
	}
	b.err = io.EOF
	if !held {
		return 0, io.EOF
	}
	b.read++
	p[0] = b.last[0]
	return 1, nil
}

// fail ends the body with the error of op: a *ResultError for "verify", the blob
// store's own error for "get" (not counted when the caller went away).
func (b *ResultBody) fail(op string, cause error) error {
	if op == "verify" {
		b.err = &ResultError{Ref: b.ref, cause: cause}
	} else {
		b.err = cause
	}
	if op == "verify" || b.ctx.Err() == nil {
		b.onError(op)
	}
	return b.err
}

// Close releases the blob.
func (b *ResultBody) Close() error {
	err := b.src.Close()
	b.cancel()
	return err
}

// SweepBlobs deletes up to limit blobs whose records expired more than the sweep's
// grace (BlobOptions.SweepGrace) before now, and answers how many it deleted. Blob names sort by their record's
// expiry, so a sweep reads only the expired ones and the first live one. It covers
// records that left without a purge (retention, Redis's own expiry or eviction) and
// blobs whose record never came to refer to them (a daemon killed between writing a
// blob and storing its record).
func (s *Service) SweepBlobs(ctx context.Context, now time.Time, limit int) (int, error) {
	if s.blobs == nil {
		return 0, nil
	}
	cutoff := now.Add(-s.blobs.sweepGrace)
	var names []string
	err := s.blobs.store.List(ctx, "", func(name string) bool {
		exp, ok := BlobExpiry(name)
		if !ok {
			return true // not a name of the daemon's: left alone
		}
		if !exp.Before(cutoff) {
			return false
		}
		names = append(names, name)
		return len(names) < limit
	})
	if err != nil {
		s.blobs.onError("sweep")
		return 0, err
	}
	deleted := 0
	for _, name := range names {
		if err := s.blobs.store.Delete(ctx, name); err != nil {
			s.blobs.onError("sweep")
			return deleted, err
		}
		deleted++
	}
	return deleted, nil
}
