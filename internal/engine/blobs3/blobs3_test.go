package blobs3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobs3"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/tests3"
	"github.com/idemd/idemd/internal/testing/wait"
)

func TestParseURL(t *testing.T) {
	o, err := blobs3.ParseURL("s3://results/idemd/prod?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=true")
	if err != nil {
		t.Fatal(err)
	}
	want := blobs3.Options{Bucket: "results", Prefix: "idemd/prod", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1", PathStyle: true}
	if o != want {
		t.Fatalf("%+v, want %+v", o, want)
	}
	for _, bad := range []string{
		"s3://key:secret@results/p", "s3:///p", "file:///x", "s3://b/p?path_style=maybe",
		"s3://b/p?endpoint=ftp://h", "s3://b/p?endpoint=http://k:s@h", "s3://b/p?secret_key=x",
	} {
		if _, err := blobs3.ParseURL(bad); err == nil {
			t.Errorf("%s was taken", bad)
		}
	}
}

// The store against a real S3 server (SeaweedFS), with and without a prefix.
func TestContract(t *testing.T) {
	srv := tests3.Start(t)
	for _, prefix := range []string{"", "idemd/test"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			o, err := blobs3.ParseURL(srv.URL(prefix))
			if err != nil {
				t.Fatal(err)
			}
			s, err := blobs3.Open(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
			enginetest.BlobStore(t, s)
		})
	}
}

// overRedis is a service over a fresh Redis (answered too) with its blobs in the bucket
// named of a fresh S3 server, a threshold of 1 KiB and a store deadline out of a busy machine's
// way, which none of these tests is about.
func overRedis(t *testing.T, name string) (*blobs3.Store, engine.Store, *engine.Service) {
	t.Helper()
	srv := tests3.Start(t)
	store, err := redisstore.Open(testredis.Start(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	o, err := blobs3.ParseURL(srv.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := blobs3.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return bucket, store, engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute),
		engine.WithBlobs(bucket, engine.BlobOptions{Threshold: 1024}))
}

// Over Redis with its blobs in S3: a record that Redis expires silently leaves its
// blob to the sweep, which deletes it once the record's expiry and the grace have
// passed, and leaves a live record's blob alone.
func TestSweepAfterRedisExpiry(t *testing.T) {
	ctx := context.Background()
	bucket, store, s := overRedis(t, "sweep")
	complete := func(key string, retention time.Duration) {
		id := engine.ID{Tenant: engine.DefaultTenant, Key: key}
		res, err := s.Claim(ctx, engine.ClaimRequest{ID: id, Fingerprint: "fp"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: res.Record.LeaseToken, Retention: retention,
			Response: engine.Response{Status: 200, Body: bytes.Repeat([]byte("z"), 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	complete("short", 100*time.Millisecond)
	complete("long", time.Hour)
	names := func() []string {
		var out []string
		if err := bucket.List(ctx, "", func(n string) bool { out = append(out, n); return true }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := names(); len(got) != 2 {
		t.Fatalf("objects: %v, want two", got)
	}
	wait.For(t, 10*time.Second, "Redis to expire the short record", func() bool {
		_, err := store.Lookup(ctx, engine.ID{Tenant: engine.DefaultTenant, Key: "short"})
		return errors.Is(err, engine.ErrNotFound)
	})
	if n, err := s.SweepBlobs(ctx, time.Now(), 100); err != nil || n != 0 {
		t.Fatalf("a sweep within the grace: %d %v, want none deleted", n, err)
	}
	if n, err := s.SweepBlobs(ctx, time.Now().Add(engine.BlobSweepGrace+time.Second), 100); err != nil || n != 1 {
		t.Fatalf("a sweep past the grace: %d %v, want one deleted", n, err)
	}
	got := names()
	if len(got) != 1 {
		t.Fatalf("objects after the sweep: %v, want the long record's", got)
	}
	res, err := s.Claim(ctx, engine.ClaimRequest{ID: engine.ID{Tenant: engine.DefaultTenant, Key: "long"}, Fingerprint: "fp"})
	if err != nil || res.Outcome != engine.OutcomeCompleted || len(res.Record.Response.Body) != 4096 {
		t.Fatalf("the live record's replay after the sweep: %v %v", res.Outcome, err)
	}
}

// Over Redis with its blobs in S3, a completion's body streams into the bucket and its
// replay streams back checked: whole when the object is intact; refused before a byte
// when the object is of another size; short of the whole, with ErrResultUnavailable,
// when its bytes were replaced by others of the same length.
func TestStreamedResultOverS3(t *testing.T) {
	ctx := context.Background()
	bucket, store, s := overRedis(t, "stream")
	body := make([]byte, 300<<10)
	_, _ = rand.Read(body)
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "streamed"}
	res, err := s.Claim(ctx, engine.ClaimRequest{ID: id, Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: res.Record.LeaseToken, Response: engine.Response{Status: 200},
		Body: bytes.NewReader(body), BodySize: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	read := func() ([]byte, error) {
		_, rb, err := s.LookupResult(ctx, id)
		if err != nil {
			return nil, err
		}
		defer rb.Close()
		var got bytes.Buffer
		_, err = io.CopyBuffer(struct{ io.Writer }{&got}, rb, make([]byte, 8192))
		return got.Bytes(), err
	}
	if got, err := read(); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("replay of an intact object: %v, %d bytes", err, len(got))
	}
	// A reader slower in all than the deadline for the size (2 s and 250 ms for the
	// 300 KiB), yet never idle that long, reads the whole: the deadline runs from the
	// last bytes read.
	paced := engine.NewService(store, time.Hour, engine.WithStoreTimeout(2*time.Second), engine.WithBlobs(bucket, engine.BlobOptions{Threshold: 1024}))
	_, rb, err := paced.LookupResult(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for part := make([]byte, 20<<10); ; {
		time.Sleep(200 * time.Millisecond) // a slow reader
		n, err := rb.Read(part)
		got.Write(part[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("a slow reader, after %d bytes: %v", got.Len(), err)
		}
	}
	_ = rb.Close()
	if !bytes.Equal(got.Bytes(), body) {
		t.Fatalf("a slow reader got %d bytes, want the %d", got.Len(), len(body))
	}
	raw, err := store.Lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := raw.Response.Blob()
	if _, err := bucket.Put(ctx, ref.Name, bytes.NewReader(body[:1000]), 1000); err != nil {
		t.Fatal(err)
	}
	if got, err := read(); !errors.Is(err, engine.ErrResultUnavailable) || got != nil {
		t.Fatalf("replay of a short object: %v after %d bytes, want ErrResultUnavailable before any", err, len(got))
	}
	altered := bytes.Clone(body)
	altered[len(altered)/2] ^= 0xff
	if _, err := bucket.Put(ctx, ref.Name, bytes.NewReader(altered), int64(len(altered))); err != nil {
		t.Fatal(err)
	}
	if got, err := read(); !errors.Is(err, engine.ErrResultUnavailable) || len(got) >= len(body) {
		t.Fatalf("replay of an altered object: %v after %d of %d bytes, want ErrResultUnavailable short of the whole", err, len(got), len(body))
	}
}
