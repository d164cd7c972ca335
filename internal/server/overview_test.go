package server_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// TestConsoleOverview: the tenants' overview shows a token its own tenant's usage
// against its quota and its claims in the daemon serving the page, and says which
// figures are the whole store's and which that daemon's.
func TestConsoleOverview(t *testing.T) {
	t.Parallel()
	store, err := redisstore.Open(testredis.Start(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	d := newQuotaDaemon(t, store, server.Console{Enabled: true})
	for _, key := range []string{"a", "b"} {
		expectStatus(t, "claim "+key, d.call(cappedUse, http.MethodPost, "/v1/claim", map[string]any{"key": key}), http.StatusCreated, "")
	}
	// The traffic counts whole seconds: the claims show once their second has passed.
	var a authAnswer
	var capped map[string]any
	wait.For(t, 30*time.Second, "the claims to show in the overview", func() bool {
		a = d.call(cappedUse, http.MethodGet, "/console/api/overview", nil)
		expectStatus(t, "the overview", a, http.StatusOK, "")
		tenants, _ := a.body["tenants"].([]any)
		if len(tenants) != 1 {
			t.Fatalf("a tenant's token sees %d tenants, want its own: %s", len(tenants), a.raw)
		}
		capped, _ = tenants[0].(map[string]any)
		return capped["claims_per_second"].(float64) > 0
	})
	if capped["tenant"] != "capped" || capped["records"] != float64(2) || capped["max_records"] != float64(3) ||
		capped["claims_per_second"].(float64) <= 0 || capped["stored_bytes"].(float64) <= 0 || capped["abandoned"] != float64(0) ||
		capped["pending"] != float64(2) || capped["pending_capped"] != false {
		t.Fatalf("the capped tenant's line (its two claims pending, none abandoned): %v", capped)
	}
	if pct := capped["quota_percent"].(float64); pct < 66 || pct > 67 {
		t.Fatalf("quota_percent %v, want 2 of 3 records", pct)
	}
	if a.str("scope") == "" || a.str("daemon") == "" {
		t.Fatalf("the overview does not say whose figures it shows: %s", a.raw)
	}
}

// TestConsoleOverviewPendingCapped: past 1000 pending keys, the overview stops counting
// and says there are at least that many, so that a tenant with much in flight costs a
// bounded read.
func TestConsoleOverviewPendingCapped(t *testing.T) {
	t.Parallel()
	store, err := redisstore.Open(testredis.Start(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	d := newQuotaDaemon(t, store, server.Console{Enabled: true})
	// Leases long enough that none runs out while a slow machine makes the claims.
	for i := range 1001 {
		expectStatus(t, "a claim", d.call(freeUse, http.MethodPost, "/v1/claim", map[string]any{"key": fmt.Sprintf("job-%04d", i), "lease_ms": 3_600_000}), http.StatusCreated, "")
	}
	a := d.call(freeUse, http.MethodGet, "/console/api/overview", nil)
	expectStatus(t, "the overview", a, http.StatusOK, "")
	tenants, _ := a.body["tenants"].([]any)
	if len(tenants) != 1 {
		t.Fatalf("the overview: %s", a.raw)
	}
	free, _ := tenants[0].(map[string]any)
	if free["pending"] != float64(1000) || free["pending_capped"] != true || free["abandoned"] != float64(0) {
		t.Fatalf("1001 pending keys show as %v pending (capped %v), %v abandoned; want at least 1000 and none abandoned",
			free["pending"], free["pending_capped"], free["abandoned"])
	}
}
