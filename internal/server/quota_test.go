package server_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

const (
	cappedUse = "capped-use-token"
	freeUse   = "free-use-token"
)

func quotaAuthFile() string {
	return `
tenants:
  capped: {max_records: 3, max_stored_bytes: 1048576}
  free: {}
tokens:
  - {name: capped-app, tenant: capped, scopes: [use], sha256: ` + tokenHash(cappedUse) + `}
  - {name: free-app, tenant: free, scopes: [use], sha256: ` + tokenHash(freeUse) + `}
`
}

// newQuotaDaemon is a real HTTP server over store with the quota auth file, reading
// usage from the store at every request but the first few.
func newQuotaDaemon(t *testing.T, store engine.Store, console ...server.Console) *authDaemon {
	t.Helper()
	return newQuotaDaemonWith(t, store, quotaAuthFile(), time.Millisecond, console...)
}

// newQuotaDaemonWith is newQuotaDaemon with an auth file of its own and the age of
// usage at which the store is read again.
func newQuotaDaemonWith(t *testing.T, store engine.Store, authFile string, refresh time.Duration, console ...server.Console) *authDaemon {
	t.Helper()
	t.Cleanup(func() { _ = store.Close() })
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(authFile), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	service := engine.NewService(store, 24*time.Hour, engine.WithStoreTimeout(time.Minute),
		engine.WithUsageRefresh(refresh))
	cfg := server.Config{
		Limits: server.Limits{MaxResponseBytes: 1024},
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Auth:   keyring,
	}
	if len(console) > 0 {
		cfg.Console = console[0]
	}
	srv := server.New(service, cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &authDaemon{t: t, url: hs.URL, logs: logs}
}

// TestQuota: a tenant at its quota is refused new keys with quota_exceeded, its usage
// and limit, and a Retry-After; another tenant is served; the capped tenant's replays,
// lookups and granted leases still work; and once a record expires the tenant acquires
// again. On the embedded store, Redis and a Redis Cluster.
func TestQuota(t *testing.T) {
	t.Parallel()
	for name, open := range quotaStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testQuota(t, newQuotaDaemon(t, open(t)))
		})
	}
}

// quotaStores opens each store a quota test runs on: the embedded store, Redis and,
// unless -short, a Redis Cluster.
func quotaStores() map[string]func(t *testing.T) engine.Store {
	return map[string]func(t *testing.T) engine.Store{
		"embedded": func(t *testing.T) engine.Store {
			s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{SweepInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"redis": func(t *testing.T) engine.Store {
			s, err := redisstore.Open(testredis.Start(t).URL())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"cluster": func(t *testing.T) engine.Store {
			if testing.Short() {
				t.Skip("a Redis Cluster takes a while to start")
			}
			s, err := redisstore.Open(testredis.StartCluster(t).URL())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

const (
	parallelUse = "parallel-use-token"
	batchUse    = "batch-use-token"
)

func concurrentQuotaAuthFile() string {
	return `
tenants:
  parallel: {max_records: 50}
  batched: {max_records: 50}
tokens:
  - {name: parallel-app, tenant: parallel, scopes: [use], sha256: ` + tokenHash(parallelUse) + `}
  - {name: batch-app, tenant: batched, scopes: [use], sha256: ` + tokenHash(batchUse) + `}
`
}

// TestQuotaHoldsUnderConcurrency: claims in flight count against the quota until they
// answer, so that however many arrive at once, single or in one batch, one daemon
// never acquires past max_records; and what was reserved for a claim that did not
// acquire is given back, so the tenant still fills its quota exactly. On the embedded
// store, Redis and a Redis Cluster, with usage read from the store every two seconds.
func TestQuotaHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	for name, open := range quotaStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := newQuotaDaemonWith(t, open(t), concurrentQuotaAuthFile(), engine.DefaultUsageRefresh)
			claim := func(token, key string) authAnswer {
				return d.call(token, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp"})
			}
			// fill claims new keys one at a time until the quota refuses one, and
			// returns how many it acquired.
			fill := func(token, prefix string) int {
				for i := range 100 {
					a := claim(token, prefix+strconv.Itoa(i))
					if a.status == http.StatusTooManyRequests {
						expectStatus(t, "a claim past the quota", a, http.StatusTooManyRequests, "quota_exceeded")
						return i
					}
					expectStatus(t, "a claim under the quota", a, http.StatusCreated, "")
				}
				t.Fatal("100 claims past a quota of 50 records were all acquired")
				return 0
			}

			for i := range 45 {
				expectStatus(t, "claim under the quota", claim(parallelUse, "held-"+strconv.Itoa(i)), http.StatusCreated, "")
			}
			statuses := make([]int, 16)
			var wg sync.WaitGroup
			for i := range statuses {
				wg.Go(func() { statuses[i] = claim(parallelUse, "racing-"+strconv.Itoa(i)).status })
			}
			wg.Wait()
			acquired := 0
			for _, status := range statuses {
				switch status {
				case http.StatusCreated:
					acquired++
				case http.StatusTooManyRequests:
				default:
					t.Fatalf("a parallel claim answered %d", status)
				}
			}
			if acquired > 5 {
				t.Fatalf("16 parallel claims with 45 of 50 records held acquired %d keys, past the quota", acquired)
			}
			if more := fill(parallelUse, "after-"); 45+acquired+more != 50 {
				t.Fatalf("45 held, %d acquired in parallel, %d one by one: the tenant holds %d records, want its quota of 50",
					acquired, more, 45+acquired+more)
			}

			for i := range 49 {
				expectStatus(t, "claim under the quota", claim(batchUse, "held-"+strconv.Itoa(i)), http.StatusCreated, "")
			}
			items := make([]map[string]any, 100)
			for i := range items {
				items[i] = map[string]any{"claim": map[string]any{"key": "batched-" + strconv.Itoa(i), "fingerprint": "fp"}}
			}
			a := d.call(batchUse, http.MethodPost, "/v1/batch", map[string]any{"items": items})
			expectStatus(t, "a batch of 100 claims", a, http.StatusOK, "")
			results, _ := a.body["results"].([]any)
			acquired = 0
			for _, r := range results {
				switch status := r.(map[string]any)["status"]; status {
				case float64(http.StatusCreated):
					acquired++
				case float64(http.StatusTooManyRequests):
				default:
					t.Fatalf("a batch's claim answered %v", status)
				}
			}
			if len(results) != 100 || acquired > 1 {
				t.Fatalf("a batch of 100 claims with 49 of 50 records held acquired %d of %d keys, past the quota", acquired, len(results))
			}
			if more := fill(batchUse, "after-"); 49+acquired+more != 50 {
				t.Fatalf("49 held, %d acquired by the batch, %d one by one: the tenant holds %d records, want its quota of 50",
					acquired, more, 49+acquired+more)
			}
		})
	}
}

func testQuota(t *testing.T, d *authDaemon) {
	claim := func(token, key string) authAnswer {
		return d.call(token, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp"})
	}
	complete := func(key, lease string, retentionMs int) authAnswer {
		return d.call(cappedUse, http.MethodPost, "/v1/complete", map[string]any{"key": key, "lease_token": lease,
			"retention_ms": retentionMs, "response": map[string]any{"status": 201, "body": "b2s="}})
	}
	leases := map[string]string{}
	for _, key := range []string{"kept", "held", "brief"} {
		a := claim(cappedUse, key)
		expectStatus(t, "claim "+key+" under the quota", a, http.StatusCreated, "")
		leases[key] = a.str("lease_token")
	}
	expectStatus(t, "complete kept", complete("kept", leases["kept"], 3600_000), http.StatusOK, "")
	expectStatus(t, "complete brief", complete("brief", leases["brief"], 1000), http.StatusOK, "")

	over := claim(cappedUse, "fourth")
	expectStatus(t, "a fourth key at a quota of 3 records", over, http.StatusTooManyRequests, "quota_exceeded")
	quota, _ := over.body["quota"].(map[string]any)
	if quota["limit"] != "max_records" || quota["used"] != float64(3) || quota["max"] != float64(3) ||
		quota["records"] != float64(3) || quota["stored_bytes"].(float64) <= 0 {
		t.Fatalf("the refusal's quota: %v, want max_records 3 of 3 with the bytes", quota)
	}
	if s, err := strconv.Atoi(over.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q, want the seconds until a record expires", over.header.Get("Retry-After"))
	}

	metrics := d.call(cappedUse, http.MethodGet, "/metrics", nil).raw
	for _, want := range []string{`idemd_tenant_quota_records{tenant="capped"} 3`, `idemd_tenant_quota_bytes{tenant="capped"} 1.048576e+06`,
		`idemd_tenant_records{tenant="capped"} `, `idemd_tenant_stored_bytes{tenant="capped"} `} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("the metrics have no %s", want)
		}
	}
	if strings.Contains(metrics, `idemd_tenant_records{tenant="free"}`) || strings.Contains(metrics, `idemd_tenant_stored_bytes{tenant="free"}`) {
		t.Fatal("a tenant's token is shown another tenant's usage")
	}

	expectStatus(t, "another tenant claims", claim(freeUse, "fourth"), http.StatusCreated, "")
	expectStatus(t, "a replay at the quota", claim(cappedUse, "kept"), http.StatusOK, "")
	expectStatus(t, "a lookup at the quota", d.call(cappedUse, http.MethodGet, recordPath("kept"), nil), http.StatusOK, "")
	expectStatus(t, "a live lease's key at the quota", claim(cappedUse, "held"), http.StatusConflict, "in_progress")
	expectStatus(t, "renewing a granted lease at the quota", d.call(cappedUse, http.MethodPost, "/v1/extend",
		map[string]any{"key": "held", "lease_token": leases["held"], "lease_ms": 30000}), http.StatusOK, "")
	expectStatus(t, "completing a granted lease at the quota", complete("held", leases["held"], 3600_000), http.StatusOK, "")
	expectStatus(t, "its replay", claim(cappedUse, "held"), http.StatusOK, "")

	// brief expires after a second; its count goes with it, within the store's span.
	var again authAnswer
	wait.For(t, 90*time.Second, "the tenant to acquire again once a record expired", func() bool {
		again = claim(cappedUse, "fourth")
		return again.status != http.StatusTooManyRequests
	})
	expectStatus(t, "a new key once a record expired", again, http.StatusCreated, "")
}

// TestQuotaRefusalIsRightTheFirstTime: the first refusal of a tenant that reached its
// quota between two reads of its usage (the daemon's own acquisitions since counted as
// estimates, whose expiry the last read did not know) rests on a read of the store: its
// records and stored bytes are the store's, and it says when to retry. On the embedded
// store, Redis and a Redis Cluster, with usage read from the store every two seconds.
func TestQuotaRefusalIsRightTheFirstTime(t *testing.T) {
	t.Parallel()
	for name, open := range quotaStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := open(t)
			d := newQuotaDaemonWith(t, store, quotaAuthFile(), engine.DefaultUsageRefresh)
			for _, key := range []string{"one", "two", "three"} {
				a := d.call(cappedUse, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp"})
				expectStatus(t, "claim "+key+" under the quota", a, http.StatusCreated, "")
			}
			over := d.call(cappedUse, http.MethodPost, "/v1/claim", map[string]any{"key": "four", "fingerprint": "fp"})
			expectStatus(t, "a fourth key at a quota of 3 records", over, http.StatusTooManyRequests, "quota_exceeded")
			if s, err := strconv.Atoi(over.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("Retry-After %q, want the seconds until a record expires", over.header.Get("Retry-After"))
			}
			if ms, _ := over.body["retry_after_ms"].(float64); ms <= 0 {
				t.Errorf("retry_after_ms %v, want the milliseconds until a record expires: %s", over.body["retry_after_ms"], over.raw)
			}
			u, err := store.(engine.UsageReader).Usage(t.Context(), "capped")
			if err != nil {
				t.Fatal(err)
			}
			quota, _ := over.body["quota"].(map[string]any)
			if quota["records"] != float64(u.Records) || quota["stored_bytes"] != float64(u.Bytes) {
				t.Fatalf("the refusal's usage: %v records, %v stored bytes; the store counts %d and %d",
					quota["records"], quota["stored_bytes"], u.Records, u.Bytes)
			}
		})
	}
}

const (
	importUse   = "import-admin-token"
	bytesUse    = "bytes-admin-token"
	completeUse = "complete-use-token"
)

func writeQuotaAuthFile() string {
	return `
tenants:
  importer: {max_records: 10}
  byteimporter: {max_stored_bytes: 10000}
  completer: {max_stored_bytes: 4096}
tokens:
  - {name: importer-admin, tenant: importer, scopes: [use, admin], sha256: ` + tokenHash(importUse) + `}
  - {name: byteimporter-admin, tenant: byteimporter, scopes: [use, admin], sha256: ` + tokenHash(bytesUse) + `}
  - {name: completer-app, tenant: completer, scopes: [use], sha256: ` + tokenHash(completeUse) + `}
`
}

// recordStream is a record stream of n completed records of tenant, each with a
// response of size bytes.
func recordStream(t *testing.T, tenant string, n, size int) []byte {
	t.Helper()
	var b bytes.Buffer
	now := time.Now()
	w, err := engine.NewStreamWriter(&b, "test", now)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		key := "imported-" + strconv.Itoa(i)
		e := engine.Exported{KeyDigest: engine.KeyDigest(key)}
		e.ID = engine.ID{Tenant: tenant, Key: key}
		e.State, e.Fingerprint, e.Attempt = engine.StateCompleted, "fp", 1
		e.CreatedAt, e.UpdatedAt, e.ExpiresAt = now, now, now.Add(time.Hour)
		e.Response = &engine.Response{Status: 200, Body: bytes.Repeat([]byte("x"), size)}
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestQuotaHoldsForImportsAndCompletions: no path goes around a quota. An import writes
// a tenant's records only within its max_records and max_stored_bytes, and is refused
// with quota_exceeded once at either; a tenant that claims small and completes big
// keeps at most twice its max_stored_bytes, with every lease it can hold completed, each
// completion answered (the work that
// ran is never run again), those past the allowance stored without their body, as
// 409 response_not_stored. On the embedded store, Redis and a Redis Cluster.
func TestQuotaHoldsForImportsAndCompletions(t *testing.T) {
	t.Parallel()
	for name, open := range quotaStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := open(t)
			d := newQuotaDaemonWith(t, store, writeQuotaAuthFile(), engine.DefaultUsageRefresh)
			usage := func(tenant string) engine.Usage {
				u, err := store.(engine.UsageReader).Usage(t.Context(), tenant)
				if err != nil {
					t.Fatal(err)
				}
				return u
			}
			importStream := func(token string, stream []byte) authAnswer {
				req, err := http.NewRequest(http.MethodPost, d.url+"/v1/admin/records", bytes.NewReader(stream))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/x-ndjson")
				return d.send(req)
			}

			a := importStream(importUse, recordStream(t, "importer", 40, 500))
			expectStatus(t, "an import of 40 records at max_records 10", a, http.StatusTooManyRequests, "quota_exceeded")
			if u := usage("importer"); u.Records != 10 {
				t.Fatalf("an import at max_records 10 left the tenant %d records", u.Records)
			}
			a = importStream(bytesUse, recordStream(t, "byteimporter", 40, 1000))
			expectStatus(t, "an import of 40 kB at max_stored_bytes 10000", a, http.StatusTooManyRequests, "quota_exceeded")
			if u := usage("byteimporter"); u.Bytes > 10000 || u.Records == 0 {
				t.Fatalf("an import at max_stored_bytes 10000 left the tenant %d records of %d bytes", u.Records, u.Bytes)
			}

			// As many leases as the quota lets the tenant hold.
			var leases []string
			for i := range 100 {
				a := d.call(completeUse, http.MethodPost, "/v1/claim", map[string]any{"key": "big-" + strconv.Itoa(i), "fingerprint": "fp"})
				if a.status == http.StatusTooManyRequests {
					break
				}
				expectStatus(t, "a small claim", a, http.StatusCreated, "")
				leases = append(leases, a.str("lease_token"))
			}
			if len(leases) < 5 || len(leases) == 100 {
				t.Fatalf("the tenant holds %d leases at max_stored_bytes 4096", len(leases))
			}
			body := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("y"), 1000))
			for i, lease := range leases {
				a := d.call(completeUse, http.MethodPost, "/v1/complete", map[string]any{"key": "big-" + strconv.Itoa(i),
					"lease_token": lease, "response": map[string]any{"status": 200, "body": body}})
				expectStatus(t, "a big completion of a lease held", a, http.StatusOK, "")
			}
			if u := usage("completer"); u.Bytes > 2*4096 {
				t.Fatalf("%d completions of 1000 bytes left the tenant %d stored bytes, past twice its max_stored_bytes of 4096", len(leases), u.Bytes)
			}
			last := d.call(completeUse, http.MethodPost, "/v1/claim", map[string]any{"key": "big-" + strconv.Itoa(len(leases)-1), "fingerprint": "fp"})
			if last.status != http.StatusOK {
				t.Fatalf("the replay of the last completion: %d %s", last.status, last.raw)
			}
			resp, _ := last.body["response"].(map[string]any)
			stored, _ := base64.StdEncoding.DecodeString(fmt.Sprint(resp["body"]))
			if resp["status"] != float64(http.StatusConflict) || !strings.Contains(string(stored), "response_not_stored") {
				t.Fatalf("the replay of a completion past the allowance: %s, want 409 response_not_stored", last.raw)
			}
		})
	}
}

// TestTenantUsageMetricsAreNotOpen: the open scrape of /metrics names no tenant's
// records or stored bytes unless the operator asks for it; a tenant's token is shown
// its own tenant's usage alone, and a platform token every tenant's.
func TestTenantUsageMetricsAreNotOpen(t *testing.T) {
	t.Parallel()
	const platform = "platform-token"
	authFile := quotaAuthFile() + `  - {name: platform, tenant: free, scopes: [use, platform], sha256: ` + tokenHash(platform) + `}
`
	for _, open := range []bool{false, true} {
		store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		path := filepath.Join(t.TempDir(), "auth.yaml")
		if err := os.WriteFile(path, []byte(authFile), 0o600); err != nil {
			t.Fatal(err)
		}
		keyring, err := auth.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(server.New(engine.NewService(store, time.Hour), server.Config{Auth: keyring, MetricsTenantUsage: open,
			Logger: slog.New(slog.NewJSONHandler(&lockedBuffer{}, nil))}))
		t.Cleanup(hs.Close)
		d := &authDaemon{t: t, url: hs.URL, logs: &lockedBuffer{}}
		expectStatus(t, "a claim", d.call(cappedUse, http.MethodPost, "/v1/claim", map[string]any{"key": "k"}), http.StatusCreated, "")

		series := func(metrics string) []string {
			var names []string
			for _, line := range strings.Split(metrics, "\n") {
				for _, tenant := range []string{"capped", "free"} {
					if strings.HasPrefix(line, "idemd_tenant_") && strings.Contains(line, `tenant="`+tenant+`"`) &&
						(strings.Contains(line, "_records{") || strings.Contains(line, "_bytes{")) {
						names = append(names, tenant)
					}
				}
			}
			return names
		}
		has := func(names []string, tenant string) bool { return strings.Contains(strings.Join(names, " "), tenant) }
		anonymous := series(d.metrics())
		if open != (has(anonymous, "capped") && has(anonymous, "free")) || !open && len(anonymous) > 0 {
			t.Fatalf("with --metrics-tenant-usage %v, the open scrape names the usage of %v", open, anonymous)
		}
		own := series(d.call(cappedUse, http.MethodGet, "/metrics", nil).raw)
		if !has(own, "capped") || !open && has(own, "free") {
			t.Fatalf("with --metrics-tenant-usage %v, a tenant's token is shown the usage of %v, want its own", open, own)
		}
		all := series(d.call(platform, http.MethodGet, "/metrics", nil).raw)
		if !has(all, "capped") || !has(all, "free") {
			t.Fatalf("a platform token is shown the usage of %v, want every tenant's", all)
		}
	}
}
