package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
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

// TestExportImportLargeResults: a result kept in a blob store leaves in the stream
// whole, its body inline as any body, and an import into a daemon with a blob store
// of its own keeps it there again, replayed byte for byte.
func TestExportImportLargeResults(t *testing.T) {
	fromBlobs, toBlobs := t.TempDir(), t.TempDir()
	from := startDaemon(t, "--blob-store", "file://"+fromBlobs)
	body := make([]byte, 1<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	post := func(base, path string, req any) map[string]any {
		t.Helper()
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(base+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("POST %s: %d, undecodable: %v", path, resp.StatusCode, err)
		}
		if resp.StatusCode >= 300 {
			t.Fatalf("POST %s: %d %v", path, resp.StatusCode, out)
		}
		return out
	}
	lease := post(from, "/v1/claim", map[string]any{"key": "large"})["lease_token"]
	post(from, "/v1/complete", map[string]any{"key": "large", "lease_token": lease,
		"response": map[string]any{"status": 200, "headers": map[string][]string{"Content-Type": {"application/octet-stream"}}, "body": body}})
	blobs := func(dir string) int {
		files, err := filepath.Glob(filepath.Join(dir, "*", "*"))
		if err != nil {
			t.Fatal(err)
		}
		return len(files)
	}
	if n := blobs(fromBlobs); n != 1 {
		t.Fatalf("%d blobs after a 1 MiB completion, want 1", n)
	}

	file := filepath.Join(t.TempDir(), "records.jsonl")
	expect(t, idemctl(map[string]string{"IDEMD_URL": from}, "export", "--out", file), exitOK, "export")
	stream, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(stream)), "\n")
	if len(lines) != 3 {
		t.Fatalf("the stream has %d lines, want a header, one record and a trailer", len(lines))
	}
	var rec struct {
		Response struct {
			Headers map[string][]string `json:"headers"`
			Body    []byte              `json:"body"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &rec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec.Response.Body, body) {
		t.Fatalf("the stream's body is %d bytes, not the 1 MiB completed", len(rec.Response.Body))
	}
	if _, ok := rec.Response.Headers["Idemd-Blob"]; ok {
		t.Fatal("the stream carries the blob's reference")
	}

	to := startDaemon(t, "--blob-store", "file://"+toBlobs)
	r := idemctl(map[string]string{"IDEMD_URL": to}, "import", file, "--json")
	expect(t, r, exitOK, "import")
	if out := r.json(t); out["written"] != float64(1) {
		t.Fatalf("import: %v", out)
	}
	if n := blobs(toBlobs); n != 1 {
		t.Fatalf("%d blobs after importing a 1 MiB result, want 1", n)
	}
	replay := post(to, "/v1/claim", map[string]any{"key": "large"})
	got, _ := base64.StdEncoding.DecodeString(replay["response"].(map[string]any)["body"].(string))
	if replay["outcome"] != "completed" || !bytes.Equal(got, body) {
		t.Fatalf("replay after import: %v, %d bytes; want the 1 MiB completed", replay["outcome"], len(got))
	}
	// An import repeated writes nothing, and leaves no blob behind.
	r = idemctl(map[string]string{"IDEMD_URL": to}, "import", file, "--json")
	expect(t, r, exitOK, "import again")
	if out := r.json(t); out["same"] != float64(1) {
		t.Fatalf("import again: %v", out)
	}
	if n := blobs(toBlobs); n != 1 {
		t.Fatalf("%d blobs after importing the same result again, want 1", n)
	}
}
