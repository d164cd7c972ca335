package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestTenantUsage shows each tenant's usage against its quota: a tenant at its quota of two
// records, whose third key is refused, and one without a quota.
func TestTenantUsage(t *testing.T) {
	token, entry := newToken(t, "capped", "use", "capped-api")
	_, freeEntry := newToken(t, "free", "use", "free-api")
	platform, platformEntry := newToken(t, "free", "use,platform", "platform-api")
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, authPath, "tenants:\n  capped: {max_records: 2, max_stored_bytes: 100000}\n  free: {}\ntokens:\n"+entry+freeEntry+platformEntry)
	base := startDaemon(t, "--auth-file", authPath)
	env := map[string]string{"IDEMD_URL": base, "IDEMD_TOKEN": token}
	for _, key := range []string{"order-1", "order-2"} {
		expect(t, idemctl(env, "claim", key), exitOK, "claim "+key)
	}
	r := idemctl(env, "claim", "order-3", "--json")
	expect(t, r, exitRefused, "a claim at the quota")
	if p := r.json(t); p["code"] != "quota_exceeded" || p["status"] != float64(429) {
		t.Fatalf("a claim at the quota: %v", p)
	}

	// A tenant's token is shown its own tenant alone.
	r = idemctl(env, "usage", "--json")
	expect(t, r, exitOK, "usage --json")
	var own usageReport
	if err := json.Unmarshal([]byte(r.stdout), &own); err != nil {
		t.Fatalf("usage --json: %v: %s", err, r.stdout)
	}
	if len(own.Tenants) != 1 || own.Tenants[0].Tenant != "capped" {
		t.Fatalf("usage --json with the capped tenant's token: %s, want its own tenant alone", r.stdout)
	}

	env["IDEMD_TOKEN"] = platform
	r = idemctl(env, "usage", "--json")
	expect(t, r, exitOK, "usage --json")
	var report usageReport
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatalf("usage --json: %v: %s", err, r.stdout)
	}
	if len(report.Tenants) != 2 || report.StoreFill == nil {
		t.Fatalf("usage --json: %s, want two tenants and the store's fill", r.stdout)
	}
	capped, free := report.Tenants[0], report.Tenants[1]
	if capped.Tenant != "capped" || capped.Records != 2 || capped.MaxRecords != 2 || capped.MaxStored != 100000 ||
		capped.StoredBytes <= 0 || capped.QuotaPercent != 100 {
		t.Fatalf("the capped tenant: %+v", capped)
	}
	if free.Tenant != "free" || free.Records != 0 || free.MaxRecords != 0 || free.QuotaPercent != 0 {
		t.Fatalf("the tenant without a quota: %+v", free)
	}

	r = idemctl(env, "usage")
	expect(t, r, exitOK, "usage")
	if !strings.Contains(r.stdout, "capped") || !strings.Contains(r.stdout, "100%") || !strings.Contains(r.stdout, "store ") {
		t.Fatalf("usage:\n%s", r.stdout)
	}
}
