package blobdir_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
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
	return engine.NewService(store, time.Hour, engine.WithBlobs(blobs, engine.BlobOptions{Threshold: 1 << 10})), store, dir
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

// A sweep leaves a blob for the grace the service was given after its record's expiry,
// and deletes it after.
func TestSweepGraceIsTheServices(t *testing.T) {
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
	const grace = 30 * time.Second
	s := engine.NewService(store, time.Hour, engine.WithBlobs(blobs, engine.BlobOptions{Threshold: 1 << 10, SweepGrace: grace}))
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
