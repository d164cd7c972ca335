package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/testing/testredis"
)

// TestExportImport moves the records of an embedded store into a Redis through the
// idemd binaries and a file: results replay from the Redis, a lease taken before the
// move comes back with its claim secret, an import repeated writes nothing, a token
// sees its own tenant's records only, and a damaged file imports nothing.
func TestExportImport(t *testing.T) {
	teamToken, teamEntry := newToken(t, "team", "use,admin", "team-oncall")
	otherToken, otherEntry := newToken(t, "other", "use,admin", "other-oncall")
	opsToken, opsEntry := newToken(t, "team", "use,admin,platform", "ops")
	useToken, useEntry := newToken(t, "team", "use", "team-api")
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, authPath, "tenants:\n  team: {}\n  other: {}\ntokens:\n"+teamEntry+otherEntry+opsEntry+useEntry)

	from := startDaemon(t, "--auth-file", authPath)
	team := map[string]string{"IDEMD_URL": from, "IDEMD_TOKEN": teamToken}
	other := map[string]string{"IDEMD_URL": from, "IDEMD_TOKEN": otherToken}

	r := idemctl(team, "claim", "order-1", "--fingerprint", "f1", "--json")
	expect(t, r, exitOK, "claim")
	lease := r.json(t)["lease_token"].(string)
	expect(t, idemctl(team, "complete", "order-1", "--lease-token", lease, "--status", "201", "--body", `{"id":42}`), exitOK, "complete")
	r = idemctl(team, "claim", "order-2", "--fingerprint", "f2", "--lease", "10m", "--json")
	expect(t, r, exitOK, "claim of the key left pending")
	secret := r.json(t)["claim_secret"].(string)
	expect(t, idemctl(other, "claim", "their-key", "--json"), exitOK, "claim in another tenant")

	dir := t.TempDir()
	teamFile, allFile := filepath.Join(dir, "team.jsonl"), filepath.Join(dir, "all.jsonl")
	r = idemctl(map[string]string{"IDEMD_URL": from, "IDEMD_TOKEN": useToken}, "export", "--out", teamFile)
	expect(t, r, exitRefused, "export without the admin scope")
	if _, err := os.Stat(teamFile); !os.IsNotExist(err) {
		t.Fatalf("a refused export left a file: %v", err)
	}
	r = idemctl(team, "export", "--out", teamFile, "--json")
	expect(t, r, exitOK, "export of the tenant")
	if out := r.json(t); out["records"] != float64(2) || len(out["sha256"].(string)) != 64 {
		t.Fatalf("export of the tenant: %v", out)
	}
	r = idemctl(map[string]string{"IDEMD_URL": from, "IDEMD_TOKEN": opsToken}, "export", "--out", allFile, "--json")
	expect(t, r, exitOK, "export of every tenant")
	if out := r.json(t); out["records"] != float64(3) {
		t.Fatalf("export with the platform scope: %v", out)
	}
	stream, err := os.ReadFile(teamFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(stream), lease) || strings.Contains(string(stream), secret) {
		t.Fatal("the stream carries a lease token or a claim secret")
	}

	srv := testredis.Start(t)
	to := startDaemon(t, "--auth-file", authPath, "--store", srv.URL())
	teamTo := map[string]string{"IDEMD_URL": to, "IDEMD_TOKEN": teamToken}

	// A damaged file imports nothing.
	damaged := filepath.Join(dir, "damaged.jsonl")
	lines := strings.SplitAfter(string(stream), "\n")
	writeFile(t, damaged, strings.Join(lines[:len(lines)-2], ""))
	r = idemctl(teamTo, "import", damaged)
	expect(t, r, exitRefused, "import of a stream cut short")
	if !strings.Contains(r.stderr, "cut short") || !strings.Contains(r.stderr, "nothing was imported") {
		t.Fatalf("import of a stream cut short: %s", r.stderr)
	}
	expect(t, idemctl(teamTo, "lookup", "order-1"), exitNotFound, "lookup after a refused import")

	// Another tenant's records need the platform scope: left out without it.
	r = idemctl(teamTo, "import", allFile, "--json")
	expect(t, r, exitOK, "import of every tenant's records by a tenant's token")
	if out := r.json(t); out["written"] != float64(2) || out["other_tenant"] != float64(1) {
		t.Fatalf("import of every tenant's records by a tenant's token: %v", out)
	}
	expect(t, idemctl(map[string]string{"IDEMD_URL": to, "IDEMD_TOKEN": otherToken}, "lookup", "their-key"), exitNotFound,
		"lookup of a record a tenant's token could not import")
	r = idemctl(map[string]string{"IDEMD_URL": to, "IDEMD_TOKEN": opsToken}, "import", allFile, "--json")
	expect(t, r, exitOK, "import with the platform scope")
	if out := r.json(t); out["written"] != float64(1) || out["same"] != float64(2) {
		t.Fatalf("import with the platform scope: %v", out)
	}

	r = idemctl(teamTo, "claim", "order-1", "--fingerprint", "f1", "--json")
	expect(t, r, exitOK, "claim of the moved completed key")
	if out := r.json(t); out["outcome"] != "completed" {
		t.Fatalf("claim of the moved completed key: %v", out)
	}
	r = idemctl(teamTo, "claim", "order-2", "--fingerprint", "f2")
	expect(t, r, exitRefused, "claim of the moved pending key")
	if !strings.Contains(r.stderr, "in_progress") {
		t.Fatalf("claim of the moved pending key: %s", r.stderr)
	}
	r = idemctl(teamTo, "claim", "order-2", "--fingerprint", "f2", "--secret", secret, "--json")
	expect(t, r, exitOK, "claim of the moved pending key with its secret")
	if out := r.json(t); out["outcome"] != "acquired" || out["attempt"] != float64(1) {
		t.Fatalf("claim with the secret after the move: %v", out)
	}

	r = idemctl(teamTo, "import", teamFile)
	expect(t, r, exitOK, "import repeated")
	if !strings.Contains(r.stdout, "0 written, 2 there already") {
		t.Fatalf("import repeated: %s", r.stdout)
	}
}
