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

// TestTenantCapsLargeResults: a tenant's max_response_bytes bounds a result kept in the
// blob store as it bounds one kept inline, so a platform can let one team store large
// results and hold another to less. On a daemon taking results up to 4 MiB, a tenant
// capped at 2 MiB stores 1.5 MiB by reference, raw and in JSON, and is refused 3 MiB
// with 413 naming the field, nothing written to the blob store and its lease still
// held; another tenant stores the 3 MiB.
func TestTenantCapsLargeResults(t *testing.T) {
	t.Parallel()
	blobs, err := blobdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	authFile := `
tenants:
  capped: {max_response_bytes: 2097152}
  free: {}
tokens:
  - {name: capped-app, tenant: capped, scopes: [use], sha256: ` + tokenHash(cappedUse) + `}
  - {name: free-app, tenant: free, scopes: [use], sha256: ` + tokenHash(freeUse) + `}
`
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(authFile), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	store := quotaStores()["embedded"](t)
	t.Cleanup(func() { _ = store.Close() })
	svc := engine.NewService(store, 24*time.Hour, engine.WithStoreTimeout(time.Minute),
		engine.WithBlobs(blobs, engine.BlobOptions{Threshold: 64 << 10}))
	hs := httptest.NewServer(server.New(svc, server.Config{
		Limits: server.Limits{MaxResponseBytes: 64 << 10, MaxBlobBytes: 4 << 20},
		Logger: slog.New(slog.NewJSONHandler(&lockedBuffer{}, nil)),
		Auth:   keyring,
	}))
	t.Cleanup(hs.Close)
	d := &authDaemon{t: t, url: hs.URL}

	claim := func(token, key string) string {
		t.Helper()
		a := d.call(token, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp"})
		expectStatus(t, "claim "+key, a, http.StatusCreated, "")
		return a.str("lease_token")
	}
	put := func(token, key, lease string, body []byte) authAnswer {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, hs.URL+"/v1/keys/"+key+"/result", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Idemd-Lease-Token", lease)
		req.Header.Set("Idemd-Status", "200")
		return d.send(req)
	}
	within := bytes.Repeat([]byte("w"), 1536<<10)
	over := bytes.Repeat([]byte("o"), 3<<20)

	expectStatus(t, "raw 1.5 MiB in the capped tenant", put(cappedUse, "raw-within", claim(cappedUse, "raw-within"), within), http.StatusOK, "")
	lease := claim(cappedUse, "json-within")
	c := d.call(cappedUse, http.MethodPost, "/v1/complete", map[string]any{"key": "json-within", "lease_token": lease,
		"response": map[string]any{"status": 200, "body": within}})
	expectStatus(t, "JSON 1.5 MiB in the capped tenant", c, http.StatusOK, "")
	if n := countFiles(t, blobs); n != 2 {
		t.Fatalf("%d blobs, want both results within the tenant's cap kept by reference", n)
	}

	lease = claim(cappedUse, "over")
	refused := put(cappedUse, "over", lease, over)
	expectStatus(t, "raw 3 MiB in the capped tenant", refused, http.StatusRequestEntityTooLarge, "payload_too_large")
	if !bytes.Contains([]byte(refused.raw), []byte("2097152")) || !bytes.Contains([]byte(refused.raw), []byte("response")) {
		t.Fatalf("the refusal does not name the field and the tenant's limit: %s", refused.raw)
	}
	if n := countFiles(t, blobs); n != 2 {
		t.Fatalf("%d blobs after a refused result, want none written for it", n)
	}
	look := d.call(cappedUse, http.MethodGet, "/v1/records/over", nil)
	expectStatus(t, "lookup of the refused key", look, http.StatusOK, "")
	if look.str("state") != "pending" {
		t.Fatalf("the key whose result was refused: %s, want it still pending under its lease", look.raw)
	}

	expectStatus(t, "raw 3 MiB in another tenant", put(freeUse, "over", claim(freeUse, "over"), over), http.StatusOK, "")
	res, err := http.NewRequest(http.MethodGet, hs.URL+"/v1/keys/over/result", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Header.Set("Authorization", "Bearer "+freeUse)
	if got := d.send(res); got.status != http.StatusOK || got.raw != string(over) {
		t.Fatalf("the other tenant's 3 MiB result: %d, %d bytes", got.status, len(got.raw))
	}
}
