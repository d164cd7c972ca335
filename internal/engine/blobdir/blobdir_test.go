package blobdir_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/enginetest"
)

func TestContract(t *testing.T) {
	s, err := blobdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	enginetest.BlobStore(t, s)
}

func TestNamesStayInTheDirectory(t *testing.T) {
	s, err := blobdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"../x", "/etc/passwd", "a/../../x", "", "a/b.tmp"} {
		if _, err := s.Put(context.Background(), name, bytes.NewReader([]byte("x")), 1); err == nil {
			t.Fatalf("Put %q was taken", name)
		}
	}
}

// service is a Service over the embedded store with a blob directory and a threshold
// of 1 KiB.
func service(t *testing.T) (*engine.Service, engine.Store, string) {
	t.Helper()
	return serviceWith(t, engine.BlobOptions{Threshold: 1 << 10})
}

// serviceWith is service with the blob options o and the service's options opts.
func serviceWith(t *testing.T, o engine.BlobOptions, opts ...engine.Option) (*engine.Service, engine.Store, string) {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	dir := t.TempDir()
	blobs, err := blobdir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return engine.NewService(store, time.Hour, append(opts, engine.WithBlobs(blobs, o))...), store, dir
}

func acquire(t *testing.T, s *engine.Service, key string) (engine.ID, string) {
	t.Helper()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: key}
	res, err := s.Claim(context.Background(), engine.ClaimRequest{ID: id, Fingerprint: "fp"})
	if err != nil || res.Outcome != engine.OutcomeAcquired {
		t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
	}
	return id, res.Record.LeaseToken
}

func blobFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A large result goes to the directory and the record keeps only its reference; a
// claim and a lookup replay it byte for byte; a small one stays in the record.
func TestLargeResultByReference(t *testing.T) {
	ctx := context.Background()
	s, store, dir := service(t)
	body := make([]byte, 2<<20)
	_, _ = rand.Read(body)
	id, token := acquire(t, s, "large")
	resp := engine.Response{Status: 201, Headers: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: body}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: resp}); err != nil {
		t.Fatal(err)
	}
	raw, err := store.Lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ref, ok := raw.Response.Blob()
	if !ok || len(raw.Response.Body) != 0 || ref.Size != int64(len(body)) || raw.Response.Headers["Content-Type"][0] != "application/octet-stream" {
		t.Fatalf("the record keeps %d body bytes and headers %v, want a reference of %d bytes only", len(raw.Response.Body), raw.Response.Headers, len(body))
	}
	if files := blobFiles(t, dir); len(files) != 1 {
		t.Fatalf("blob files: %v, want one", files)
	}
	res, err := s.Claim(ctx, engine.ClaimRequest{ID: id, Fingerprint: "fp"})
	if err != nil || res.Outcome != engine.OutcomeCompleted {
		t.Fatalf("replay: %v %v", res.Outcome, err)
	}
	if got := res.Record.Response; got.Status != 201 || !bytes.Equal(got.Body, body) || len(got.Headers) != 1 {
		t.Fatalf("replayed status %d, %d bytes, headers %v; want 201, the %d bytes, one header", got.Status, len(got.Body), got.Headers, len(body))
	}
	looked, err := s.Lookup(ctx, id)
	if err != nil || !bytes.Equal(looked.Response.Body, body) {
		t.Fatalf("lookup: %v, %d bytes", err, len(looked.Response.Body))
	}

	small, token := acquire(t, s, "small")
	if _, err := s.Complete(ctx, engine.Completion{ID: small, LeaseToken: token, Response: engine.Response{Status: 200, Body: []byte("ok")}}); err != nil {
		t.Fatal(err)
	}
	raw, _ = store.Lookup(ctx, small)
	if _, ok := raw.Response.Blob(); ok || string(raw.Response.Body) != "ok" {
		t.Fatalf("a small result: %+v, want it inline", raw.Response)
	}
}

// A blob missing, cut short or altered is never replayed: the claim and the lookup
// answer ErrResultUnavailable.
func TestDamagedBlobIsNotReplayed(t *testing.T) {
	ctx := context.Background()
	for name, damage := range map[string]func(path string) error{
		"missing": os.Remove,
		"short":   func(p string) error { return os.Truncate(p, 100) },
		"altered": func(p string) error {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("!"), 10)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, _, dir := service(t)
			id, token := acquire(t, s, "k")
			body := bytes.Repeat([]byte("a"), 4096)
			if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: engine.Response{Status: 200, Body: body}}); err != nil {
				t.Fatal(err)
			}
			files := blobFiles(t, dir)
			if len(files) != 1 {
				t.Fatalf("blob files: %v", files)
			}
			if err := damage(files[0]); err != nil {
				t.Fatal(err)
			}
			if res, err := s.Claim(ctx, engine.ClaimRequest{ID: id, Fingerprint: "fp"}); !errors.Is(err, engine.ErrResultUnavailable) {
				t.Fatalf("claim of a %s blob: %v %v, want ErrResultUnavailable", name, res.Outcome, err)
			}
			if _, err := s.Lookup(ctx, id); !errors.Is(err, engine.ErrResultUnavailable) {
				t.Fatalf("lookup of a %s blob: %v, want ErrResultUnavailable", name, err)
			}
		})
	}
}

// A blob lives as long as its record: a purge deletes it, a completion refused
// deletes the blob written for it, and a sweep deletes those of expired records.
func TestBlobLivesAsLongAsItsRecord(t *testing.T) {
	ctx := context.Background()
	s, _, dir := service(t)
	body := bytes.Repeat([]byte("b"), 8192)

	id, token := acquire(t, s, "purged")
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: engine.Response{Status: 200, Body: body}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx, id); err != nil {
		t.Fatal(err)
	}
	if files := blobFiles(t, dir); len(files) != 0 {
		t.Fatalf("after purge: %v, want no blob", files)
	}

	id, _ = acquire(t, s, "lost")
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: "not-the-token", Response: engine.Response{Status: 200, Body: body}}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("completion with a wrong token: %v", err)
	}
	if files := blobFiles(t, dir); len(files) != 0 {
		t.Fatalf("after a refused completion: %v, want no blob", files)
	}

	id, token = acquire(t, s, "failed")
	if _, err := s.Release(ctx, engine.Release{ID: id, LeaseToken: token, Mode: engine.ReleaseFail, Response: &engine.Response{Status: 500, Body: body},
		Retention: time.Second}); err != nil {
		t.Fatal(err)
	}
	if files := blobFiles(t, dir); len(files) != 1 {
		t.Fatalf("a failure's blob: %v, want one", files)
	}
	if n, err := s.SweepBlobs(ctx, time.Now(), 100); err != nil || n != 0 {
		t.Fatalf("sweep before expiry: %d %v, want none deleted", n, err)
	}
	if n, err := s.SweepBlobs(ctx, time.Now().Add(engine.BlobSweepGrace+time.Minute), 100); err != nil || n != 1 {
		t.Fatalf("sweep past expiry and grace: %d %v, want one deleted", n, err)
	}
	if files := blobFiles(t, dir); len(files) != 0 {
		t.Fatalf("after the sweep: %v", files)
	}
}

// A temporary file a crashed write left is removed when the store opens, once it is
// older than any write takes; a fresh one (a write in flight) stays.
func TestOpenRemovesStaleTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "00000000001"), 0o700); err != nil {
		t.Fatal(err)
	}
	stale, fresh := filepath.Join(dir, "00000000001", "a.1.tmp"), filepath.Join(dir, "00000000001", "b.2.tmp")
	for _, f := range []string{stale, fresh} {
		if err := os.WriteFile(f, []byte("part"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := blobdir.Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale temporary file: %v, want removed", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("the fresh temporary file: %v, want kept", err)
	}
}

// A sealed envelope over the threshold goes to the blob store as opaque bytes and
// replays as the same sealed response.
func TestSealedResultByReference(t *testing.T) {
	ctx := context.Background()
	s, store, _ := service(t)
	env := make([]byte, 64<<10)
	_, _ = rand.Read(env)
	id, token := acquire(t, s, "sealed")
	resp := engine.Response{Status: 200, Headers: map[string][]string{engine.SealedHeader: {"1"}}, Body: env}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: resp}); err != nil {
		t.Fatal(err)
	}
	if raw, _ := store.Lookup(ctx, id); len(raw.Response.Body) != 0 {
		t.Fatalf("the record keeps %d bytes of the envelope", len(raw.Response.Body))
	}
	res, err := s.Claim(ctx, engine.ClaimRequest{ID: id, Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Record.Response.Sealed(); !bytes.Equal(got, env) {
		t.Fatalf("the replay's envelope: %d bytes, want the %d sealed", len(got), len(env))
	}
}

// A completion whose body streams goes to the directory as it is read: Put reads from
// the completion's reader, which has not yet reached its end when the blob's first
// bytes are written; a small one is read whole into the record; one under a lease not
// held is not read at all and leaves no blob.
func TestStreamedCompletion(t *testing.T) {
	ctx := context.Background()
	s, store, dir := service(t)
	body := make([]byte, 1<<20)
	_, _ = rand.Read(body)

	id, token := acquire(t, s, "streamed")
	src := &watchedReader{r: bytes.NewReader(body), dir: dir}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: engine.Response{Status: 200},
		Body: src, BodySize: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	if !src.sawTemp {
		t.Fatal("the blob's file was not begun before the body's last byte was read: the body was held whole")
	}
	looked, err := s.Lookup(ctx, id)
	if err != nil || !bytes.Equal(looked.Response.Body, body) {
		t.Fatalf("lookup of a streamed result: %v, %d bytes", err, len(looked.Response.Body))
	}

	small, token := acquire(t, s, "small")
	if _, err := s.Complete(ctx, engine.Completion{ID: small, LeaseToken: token, Response: engine.Response{Status: 200},
		Body: bytes.NewReader([]byte("ok")), BodySize: 2}); err != nil {
		t.Fatal(err)
	}
	if raw, _ := store.Lookup(ctx, small); string(raw.Response.Body) != "ok" {
		t.Fatalf("a small streamed result: %+v, want it inline", raw.Response)
	}

	lost, _ := acquire(t, s, "lost")
	unread := &watchedReader{r: bytes.NewReader(body), dir: dir}
	if _, err := s.Complete(ctx, engine.Completion{ID: lost, LeaseToken: "not-the-token", Response: engine.Response{Status: 200},
		Body: unread, BodySize: int64(len(body))}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("a streamed completion with a wrong token: %v", err)
	}
	if unread.n != 0 || len(blobFiles(t, dir)) != 1 {
		t.Fatalf("under a lease not held, %d bytes were read and %d blobs kept; want none read and only the first blob", unread.n, len(blobFiles(t, dir)))
	}

	short, token := acquire(t, s, "short")
	if _, err := s.Complete(ctx, engine.Completion{ID: short, LeaseToken: token, Response: engine.Response{Status: 200},
		Body: bytes.NewReader(body[:1000]), BodySize: int64(len(body))}); err == nil {
		t.Fatal("a streamed body shorter than its size was taken")
	}
	if files := blobFiles(t, dir); len(files) != 1 {
		t.Fatalf("after a body cut short: %v, want only the first blob", files)
	}
}

// watchedReader counts what is read through it and notes whether, before its last
// byte was read, a temporary blob file existed in dir.
type watchedReader struct {
	r       io.Reader
	dir     string
	n       int
	sawTemp bool
}

func (w *watchedReader) Read(p []byte) (int, error) {
	if w.n > 0 && !w.sawTemp {
		tmps, _ := filepath.Glob(filepath.Join(w.dir, "*", "*.tmp"))
		w.sawTemp = len(tmps) > 0
	}
	n, err := w.r.Read(p)
	w.n += n
	return n, err
}

// A streamed replay never hands over the whole body of a blob that is not the one
// stored: its reader meets ErrResultUnavailable having given fewer bytes than the
// body's size, wherever the damage lies; a blob of the wrong size, or missing, is
// refused before a byte is read. Each failure is counted.
func TestStreamedReplayIsWholeOrShort(t *testing.T) {
	ctx := context.Background()
	const size = 300 << 10
	flip := func(at int64) func(string) error {
		return func(p string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, at); err != nil {
				return err
			}
			b[0] ^= 0xff
			_, err = f.WriteAt(b, at)
			return err
		}
	}
	for _, c := range []struct {
		name    string
		damage  func(path string) error
		upFront bool // refused before a byte is read
		op      string
	}{
		{"intact", func(string) error { return nil }, false, ""},
		{"first byte altered", flip(0), false, "verify"},
		{"a middle byte altered", flip(size / 2), false, "verify"},
		{"last byte altered", flip(size - 1), false, "verify"},
		{"short", func(p string) error { return os.Truncate(p, size-1) }, true, "verify"},
		{"long", func(p string) error {
			f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write([]byte("x"))
			return err
		}, true, "verify"},
		{"missing", os.Remove, true, "get"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var errs []string
			s, _, dir := serviceWith(t, engine.BlobOptions{Threshold: 1 << 10,
				OnError: func(op string) { errs = append(errs, op) }})
			body := make([]byte, size)
			_, _ = rand.Read(body)
			id, token := acquire(t, s, "k")
			if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: engine.Response{Status: 200},
				Body: bytes.NewReader(body), BodySize: size}); err != nil {
				t.Fatal(err)
			}
			files := blobFiles(t, dir)
			if len(files) != 1 {
				t.Fatalf("blob files: %v", files)
			}
			if err := c.damage(files[0]); err != nil {
				t.Fatal(err)
			}
			rec, rb, err := s.LookupResult(ctx, id)
			if c.upFront {
				if !errors.Is(err, engine.ErrResultUnavailable) {
					t.Fatalf("LookupResult of a %s blob: %v, want ErrResultUnavailable before any byte", c.name, err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer rb.Close()
				if rec.Response.Status != 200 || len(rec.Response.Body) != 0 || len(rec.Response.Headers) != 0 || rb.Size() != size {
					t.Fatalf("LookupResult: %+v, size %d; want status 200, no header, the body to stream", rec.Response, rb.Size())
				}
				var got bytes.Buffer
				buf := make([]byte, 4096)
				_, err = io.CopyBuffer(struct{ io.Writer }{&got}, rb, buf)
				switch {
				case c.op == "" && (err != nil || !bytes.Equal(got.Bytes(), body)):
					t.Fatalf("an intact blob streamed: %v, %d bytes", err, got.Len())
				case c.op != "" && (!errors.Is(err, engine.ErrResultUnavailable) || got.Len() >= size):
					t.Fatalf("a blob with its %s streamed: %v after %d of %d bytes; want ErrResultUnavailable short of the whole",
						c.name, err, got.Len(), size)
				}
			}
			if c.op != "" && (len(errs) != 1 || errs[0] != c.op) {
				t.Fatalf("blob errors counted: %v, want one %q", errs, c.op)
			}
			if c.op == "" && len(errs) != 0 {
				t.Fatalf("blob errors counted for an intact blob: %v", errs)
			}
		})
	}
}

// A streamed body arrives at its sender's pace: a sender slower in all than the blob
// store's deadline for the size, yet never idle that long, completes, since the
// deadline runs from the last bytes the store took.
func TestStreamedCompletionAtTheSendersPace(t *testing.T) {
	ctx := context.Background()
	// The deadline for 1 MiB: 2 s and 250 ms for the MiB; the sender takes 3.2 s.
	s, _, _ := serviceWith(t, engine.BlobOptions{Threshold: 1 << 10}, engine.WithStoreTimeout(2*time.Second))
	body := make([]byte, 1<<20)
	_, _ = rand.Read(body)
	id, token := acquire(t, s, "slow")
	slow := &pacedReader{r: bytes.NewReader(body), chunk: 64 << 10, pause: 200 * time.Millisecond}
	began := time.Now()
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: engine.Response{Status: 200},
		Body: slow, BodySize: int64(len(body))}); err != nil {
		t.Fatalf("a body sent in 16 parts 200 ms apart, %s in all: %v", time.Since(began), err)
	}
	looked, err := s.Lookup(ctx, id)
	if err != nil || !bytes.Equal(looked.Response.Body, body) {
		t.Fatalf("lookup: %v, %d bytes", err, len(looked.Response.Body))
	}
}

// pacedReader gives at most chunk bytes a read, each after pause: a slow sender.
type pacedReader struct {
	r     io.Reader
	chunk int
	pause time.Duration
}

func (p *pacedReader) Read(b []byte) (int, error) {
	time.Sleep(p.pause)
	return p.r.Read(b[:min(len(b), p.chunk)])
}

// A sweep leaves a blob for the grace the service was given after its record's expiry,
// and deletes it after.
func TestSweepGraceIsTheServices(t *testing.T) {
	const grace = 30 * time.Second
	s, _, dir := serviceWith(t, engine.BlobOptions{Threshold: 1 << 10, SweepGrace: grace})
	ctx := context.Background()
	id, token := acquire(t, s, "short")
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Response: engine.Response{Status: 200, Body: bytes.Repeat([]byte("x"), 4<<10)},
		Retention: time.Second}); err != nil {
		t.Fatal(err)
	}
	files := blobFiles(t, dir)
	if len(files) != 1 {
		t.Fatalf("blobs: %v, want one", files)
	}
	expiry, ok := engine.BlobExpiry(filepath.ToSlash(filepath.Join(filepath.Base(filepath.Dir(files[0])), filepath.Base(files[0]))))
	if !ok {
		t.Fatalf("%s is not a blob's name", files[0])
	}
	if n, err := s.SweepBlobs(ctx, expiry.Add(grace-time.Second), 100); err != nil || n != 0 {
		t.Fatalf("sweep within the grace: %d %v, want none deleted", n, err)
	}
	if n, err := s.SweepBlobs(ctx, expiry.Add(grace+time.Second), 100); err != nil || n != 1 {
		t.Fatalf("sweep past the grace: %d %v, want one deleted", n, err)
	}
}
