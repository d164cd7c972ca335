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
// max_stored_bytes at its full size, not at the size of its reference. With a quota of
// 1 MiB, a first result of 600 KiB is kept by reference and the usage shows its bytes;
// a second of 600 KiB would take the tenant past its allowance (1¼ × the quota) only
// because the first's blob counts, so it is finished as response_not_stored and no
// second blob is written. On the embedded store and Redis.
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
	first := claim("first")
	expectStatus(t, "claim first", first, http.StatusCreated, "")
	c := d.call(cappedUse, http.MethodPost, "/v1/complete", map[string]any{"key": "first", "lease_token": first.str("lease_token"),
		"response": map[string]any{"status": 200, "body": body}})
	expectStatus(t, "complete first with 600 KiB", c, http.StatusOK, "")
	if n := countFiles(t, blobs); n != 1 {
		t.Fatalf("%d blobs, want the first result kept by reference", n)
	}
	// The usage is read again in the background once it is older than a millisecond.
	wait.For(t, time.Minute, "the usage to count the blob's bytes", func() bool {
		u, err := svc.Usage(context.Background(), "capped")
		if err != nil {
			t.Fatal(err)
		}
		return u.Bytes >= 600<<10
	})
	second := claim("second")
	expectStatus(t, "claim second", second, http.StatusCreated, "")
	c = d.call(cappedUse, http.MethodPost, "/v1/complete", map[string]any{"key": "second", "lease_token": second.str("lease_token"),
		"response": map[string]any{"status": 200, "body": body}})
	expectStatus(t, "complete second with 600 KiB", c, http.StatusOK, "")
	if n := countFiles(t, blobs); n != 1 {
		t.Fatalf("%d blobs, want the second result not kept: the first's blob counts against the quota", n)
	}
	replay := claim("second")
	if status, _ := replay.body["response"].(map[string]any)["status"].(float64); status != http.StatusConflict {
		t.Fatalf("the second result's replay: %v, want the stored 409 response_not_stored", replay.body)
	}
	expectStatus(t, "a replay of the first", claim("first"), http.StatusOK, "")

	// The raw form streams its body into the blob store, and is held to the same
	// allowance at its full size before a byte of it is read.
	third := claim("third")
	expectStatus(t, "claim third", third, http.StatusCreated, "")
	req, err := http.NewRequest(http.MethodPut, hs.URL+"/v1/keys/third/result", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cappedUse)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Idemd-Lease-Token", third.str("lease_token"))
	req.Header.Set("Idemd-Status", "200")
	expectStatus(t, "raw PUT of 600 KiB past the allowance", d.send(req), http.StatusOK, "")
	if n := countFiles(t, blobs); n != 1 {
		t.Fatalf("%d blobs, want the raw result past the allowance not kept", n)
	}
	replay = claim("third")
	if status, _ := replay.body["response"].(map[string]any)["status"].(float64); status != http.StatusConflict {
		t.Fatalf("the raw result's replay: %v, want the stored 409 response_not_stored", replay.body)
	}
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
