package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemd/idemd/internal/testing/testredis"
)

// TestStoreGuardKeepsOtherTenantsServed is a tenant with no quota filling a Redis of
// 64 MB that refuses writes when full (noeviction, as docs/redis.md asks): alpha
// stores results of 900 KiB, then 16 KiB, then empty ones, each until it is refused.
// The store guard refuses alpha, naming its fair share, before Redis refuses anyone;
// beta, which stored nothing, then claims and completes 20 keys, every one served.
func TestStoreGuardKeepsOtherTenantsServed(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a Redis of 64 MB")
	}
	store := startGuardedDaemon(t)
	for _, phase := range []struct {
		size, most int
	}{{900 << 10, 200}, {16 << 10, 2000}, {0, 20000}} {
		stored := 0
		for ; stored < phase.most; stored++ {
			status, problem := store("alpha-token", fmt.Sprintf("alpha-%d-%d", phase.size, stored), phase.size)
			if status == 0 {
				continue
			}
			quota, _ := problem["quota"].(map[string]any)
			if status != http.StatusTooManyRequests || problem["code"] != "quota_exceeded" || quota["limit"] != "fair_share" {
				t.Fatalf("alpha's result %d of %d bytes: %d %v, want 429 quota_exceeded naming its fair share", stored, phase.size, status, problem)
			}
			if detail, _ := problem["detail"].(string); !strings.Contains(detail, "fair_share") {
				t.Fatalf("the refusal's detail %q does not say why", detail)
			}
			break
		}
		if stored == phase.most {
			t.Fatalf("alpha stored %d results of %d bytes and was never refused", stored, phase.size)
		}
		t.Logf("alpha stored %d results of %d bytes before the guard refused it", stored, phase.size)
	}
	for i := range 20 {
		if status, problem := store("beta-token", fmt.Sprintf("beta-%d", i), 1024); status != 0 {
			t.Fatalf("beta's claim and completion %d: %d %v, want both served", i, status, problem)
		}
	}
}

// startGuardedDaemon starts a daemon over a Redis of 64 MB that refuses writes when full
// (noeviction), with tenants alpha and beta and no quotas, and returns how to store a
// result: store claims key and completes it with a body of size bytes; it answers the
// refusal's status and problem, or 0 when both were served.
func startGuardedDaemon(t *testing.T) func(token, key string, size int) (int, map[string]any) {
	t.Helper()
	r := testredis.Start(t, "--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
	tokenHash := func(token string) string {
		sum := sha256.Sum256([]byte(token))
		return hex.EncodeToString(sum[:])
	}
	authFile := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(authFile, []byte(`
tenants:
  alpha: {}
  beta: {}
tokens:
  - {tenant: alpha, scopes: [use], sha256: `+tokenHash("alpha-token")+`}
  - {tenant: beta, scopes: [use], sha256: `+tokenHash("beta-token")+`}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, _, _ := startMain(t, "--store", r.URL(), "--auth-file", authFile)
	base := "http://" + m.Addr()

	call := func(token, path string, body any) (int, map[string]any) {
		t.Helper()
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var answer map[string]any
		_ = json.Unmarshal(raw, &answer)
		return resp.StatusCode, answer
	}
	// store claims key and completes it with a body of size bytes; it answers the
	// refusal's status and problem, or 0 when both were served.
	store := func(token, key string, size int) (int, map[string]any) {
		status, answer := call(token, "/v1/claim", map[string]any{"key": key})
		if status != http.StatusCreated {
			return status, answer
		}
		status, answer = call(token, "/v1/complete", map[string]any{"key": key, "lease_token": answer["lease_token"],
			"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, size))}})
		if status != http.StatusOK {
			return status, answer
		}
		return 0, nil
	}

	return store
}

// TestStoreGuardHoldsAgainstConcurrentWriters is TestStoreGuardKeepsOtherTenantsServed
// with four writers of alpha storing results of 900 KiB at once, as fast as the machine
// allows: far faster than the daemon reads the store's fill. The guard counts what the
// daemon wrote since its last read, so it refuses alpha before the fill passes its
// threshold: Redis never answers OOM to anyone, and beta is served 20 of 20 times.
func TestStoreGuardHoldsAgainstConcurrentWriters(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a Redis of 64 MB")
	}
	store := startGuardedDaemon(t)
	const writers, most = 4, 200
	refusals := make([]string, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range most {
				status, problem := store("alpha-token", fmt.Sprintf("alpha-%d-%d", w, i), 900<<10)
				if status == 0 {
					continue
				}
				quota, _ := problem["quota"].(map[string]any)
				if status != http.StatusTooManyRequests || problem["code"] != "quota_exceeded" || quota["limit"] != "fair_share" {
					refusals[w] = fmt.Sprintf("alpha's writer %d, result %d: %d %v, want 429 quota_exceeded naming its fair share", w, i, status, problem)
				}
				return
			}
			refusals[w] = fmt.Sprintf("alpha's writer %d stored %d results of 900 KiB and was never refused", w, most)
		})
	}
	wg.Wait()
	for _, refusal := range refusals {
		if refusal != "" {
			t.Error(refusal)
		}
	}
	served := 0
	for i := range 20 {
		if status, problem := store("beta-token", fmt.Sprintf("beta-%d", i), 1024); status == 0 {
			served++
		} else {
			t.Logf("beta's claim and completion %d: %d %v", i, status, problem)
		}
	}
	if served != 20 {
		t.Fatalf("beta was served %d of 20 times", served)
	}
}
