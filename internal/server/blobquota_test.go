package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/wait"
)

// TestQuotaCountsBlobs: a result kept in the blob store counts against its tenant's
// max_stored_bytes at its full size, not at the size of its reference: two results of
// 600 KiB fill a quota of 1 MiB, the usage shows their bytes, and a further claim is
// refused quota_exceeded. On the embedded store and Redis.
func TestQuotaCountsBlobs(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"embedded", "redis"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testQuotaCountsBlobs(t, quotaStores()[name](t))
		})
	}
}

func testQuotaCountsBlobs(t *testing.T, store engine.Store) {
	t.Cleanup(func() { _ = store.Close() })
	blobs, err := blobdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(quotaAuthFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(store, 24*time.Hour, engine.WithStoreTimeout(time.Minute),
		engine.WithUsageRefresh(time.Millisecond), engine.WithBlobs(blobs, engine.BlobOptions{Threshold: 64 << 10}))
	hs := httptest.NewServer(server.New(svc, server.Config{
		Limits: server.Limits{MaxResponseBytes: 64 << 10, MaxBlobBytes: 4 << 20},
		Logger: slog.New(slog.NewJSONHandler(&lockedBuffer{}, nil)),
		Auth:   keyring,
	}))
	t.Cleanup(hs.Close)
	d := &authDaemon{t: t, url: hs.URL}

	body := bytes.Repeat([]byte("z"), 600<<10)
	claim := func(key string) authAnswer {
		return d.call(cappedUse, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp"})
	}
	// The first result fits; the second takes the tenant past its quota (a claim is
	// admitted on what is stored before it, not on the result it will bring).
	for _, key := range []string{"first", "second"} {
		a := claim(key)
		expectStatus(t, "claim "+key, a, http.StatusCreated, "")
		c := d.call(cappedUse, http.MethodPost, "/v1/complete", map[string]any{"key": key, "lease_token": a.str("lease_token"),
			"response": map[string]any{"status": 200, "body": body}})
		expectStatus(t, "complete "+key+" with 600 KiB", c, http.StatusOK, "")
	}
	if n := countFiles(t, blobs); n != 2 {
		t.Fatalf("%d blobs, want the 2 results kept by reference", n)
	}
	// The usage is read again in the background once it is older than a millisecond.
	wait.For(t, time.Minute, "the usage to count the two blobs' bytes", func() bool {
		u, err := svc.Usage(context.Background(), "capped")
		if err != nil {
			t.Fatal(err)
		}
		return u.Bytes >= 2*600<<10
	})
	over := claim("third")
	expectStatus(t, "a claim past 1 MiB of stored results", over, http.StatusTooManyRequests, "quota_exceeded")
	quota, _ := over.body["quota"].(map[string]any)
	if quota["limit"] != "max_stored_bytes" || quota["stored_bytes"].(float64) < 2*600<<10 {
		t.Fatalf("the refusal's quota: %v, want max_stored_bytes with the blobs' bytes", quota)
	}
	expectStatus(t, "a replay at the quota", claim("first"), http.StatusOK, "")
}

// countFiles counts the blobs the store lists.
func countFiles(t *testing.T, blobs engine.BlobStore) int {
	t.Helper()
	n := 0
	if err := blobs.List(context.Background(), "", func(string) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	return n
}
