package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// rawCall sends one request to a daemon and answers its status, headers and body.
func rawCall(t *testing.T, method, target string, header http.Header, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, target, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, got
}

// putLarge claims key and stores body as its result with the raw PUT.
func putLarge(t *testing.T, base, key string, body []byte) {
	t.Helper()
	code, _, claimed := rawCall(t, http.MethodPost, base+"/v1/claim", http.Header{"Content-Type": {"application/json"}}, []byte(`{"key":"`+key+`"}`))
	var c struct {
		LeaseToken string `json:"lease_token"`
	}
	if code != http.StatusCreated || json.Unmarshal(claimed, &c) != nil {
		t.Fatalf("claim %s: %d %s", key, code, claimed)
	}
	code, _, text := rawCall(t, http.MethodPut, base+"/v1/keys/"+url.PathEscape(key)+"/result",
		http.Header{"Content-Type": {"application/octet-stream"}, "Idemd-Lease-Token": {c.LeaseToken}, "Idemd-Status": {"201"}}, body)
	if code != http.StatusOK {
		t.Fatalf("PUT the result of %s: %d %s", key, code, text)
	}
}

// TestBackupRestoreLargeResults backs up a daemon on the embedded store whose large
// results are kept in its default blob directory, with a key purged between the copy
// of the database and the copying of its blob; verifies the backup, and that a blob
// altered or missing fails the check; restores it and starts a daemon on it, which
// answers every large result byte for byte, raw and in a replayed claim.
func TestBackupRestoreLargeResults(t *testing.T) {
	dataDir := t.TempDir()
	base := startDaemon(t, "--data-dir", dataDir, "--store-timeout", "10s")
	bodies := map[string][]byte{}
	for i, size := range []int{1 << 20, 3 << 20, 200 << 10} {
		body := make([]byte, size)
		if _, err := rand.Read(body); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("large/%d", i)
		bodies[key] = body
		putLarge(t, base, key, body)
	}
	putLarge(t, base, "purged", make([]byte, 1<<20))
	putLarge(t, base, "small", []byte("small"))

	dir := t.TempDir()
	file := filepath.Join(dir, "idemd.backup")
	env := map[string]string{"IDEMD_URL": base}
	r := idemctl(env, "backup", "--out", file)
	expect(t, r, exitRefused, "backup without --blob-dir of records that keep blobs")
	if !strings.Contains(r.stderr, "--blob-dir") || !strings.Contains(r.stderr, "4 results") {
		t.Fatalf("backup without --blob-dir: %s", r.stderr)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("a refused backup wrote %s: %v", file, err)
	}

	// The key purged after the first copy was taken: its blob goes with its record,
	// and backup takes a new copy, which no longer holds it.
	copies := 0
	copyTaken = func() {
		if copies++; copies == 1 {
			if code, _, text := rawCall(t, http.MethodDelete, base+"/v1/records/purged", nil, nil); code != http.StatusNoContent {
				t.Errorf("purge: %d %s", code, text)
			}
		}
	}
	t.Cleanup(func() { copyTaken = func() {} })
	r = idemctl(env, "backup", "--out", file, "--blob-dir", filepath.Join(dataDir, "blobs"), "--json")
	expect(t, r, exitOK, "backup")
	if out := r.json(t); out["blobs"] != float64(3) || out["records"] != float64(4) || copies != 2 {
		t.Fatalf("backup: %v after %d copies; want 4 records, 3 blobs, 2 copies", out, copies)
	}
	if !strings.Contains(r.stderr, `key "purged"`) || !strings.Contains(r.stderr, "new copy") {
		t.Fatalf("backup does not say why it took a new copy: %s", r.stderr)
	}
	sums, err := os.ReadFile(file + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(sums)), "\n")
	if len(lines) != 4 || !strings.HasSuffix(lines[0], "  idemd.backup") || !strings.Contains(lines[1], "  idemd.backup.blobs/") {
		t.Fatalf("FILE.sha256 lists %q; want the database and its 3 blobs", lines)
	}
	// sha256sum reads the list, run in the backup's directory.
	if sum, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command(sum, "--strict", "-c", "idemd.backup.sha256")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil || strings.Count(string(out), ": OK") != 4 {
			t.Fatalf("sha256sum -c FILE.sha256: %v\n%s", err, out)
		}
	}
	blobFiles, _ := filepath.Glob(filepath.Join(file+".blobs", "*", "*"))
	if len(blobFiles) != 3 {
		t.Fatalf("the backup's blobs: %v", blobFiles)
	}
	r = idemctl(nil, "backup", "verify", file, "--json")
	expect(t, r, exitOK, "verify")
	if out := r.json(t); out["blobs"] != float64(3) {
		t.Fatalf("verify: %v", out)
	}

	// A copy of the backup with a blob altered, then missing, fails the check and
	// restores nothing.
	tampered := filepath.Join(t.TempDir(), "idemd.backup")
	for _, f := range append([]string{file, file + ".sha256"}, blobFiles...) {
		rel, _ := filepath.Rel(dir, f)
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(filepath.Dir(tampered), rel)), 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(filepath.Dir(tampered), rel), string(b))
	}
	victim, _ := filepath.Rel(dir, blobFiles[0])
	victim = filepath.Join(filepath.Dir(tampered), victim)
	b, _ := os.ReadFile(victim)
	b[len(b)/2] ^= 0x01
	writeFile(t, victim, string(b))
	r = idemctl(nil, "backup", "verify", tampered)
	expect(t, r, exitRefused, "verify of a backup with an altered blob")
	if !strings.Contains(r.stderr, "not the bytes its record names") {
		t.Fatalf("verify of an altered blob: %s", r.stderr)
	}
	refusedDir := filepath.Join(t.TempDir(), "refused")
	expect(t, idemctl(nil, "restore", tampered, "--data-dir", refusedDir), exitRefused, "restore of a backup with an altered blob")
	if _, err := os.Stat(filepath.Join(refusedDir, "idemd.db")); !os.IsNotExist(err) {
		t.Fatalf("a refused restore left a database: %v", err)
	}
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	r = idemctl(nil, "backup", "verify", tampered)
	expect(t, r, exitRefused, "verify of a backup with a blob missing")
	if !strings.Contains(r.stderr, "does not hold") || !strings.Contains(r.stderr, "incomplete") {
		t.Fatalf("verify of a missing blob: %s", r.stderr)
	}
	expect(t, idemctl(nil, "backup", "verify", tampered, "--records-only"), exitOK, "verify of the records alone")

	restoredDir := filepath.Join(t.TempDir(), "restored")
	r = idemctl(nil, "restore", file, "--data-dir", restoredDir)
	expect(t, r, exitOK, "restore")
	if !strings.Contains(r.stdout, "3 results") {
		t.Fatalf("restore: %s", r.stdout)
	}
	restored := startDaemon(t, "--data-dir", restoredDir, "--store-timeout", "10s")
	for key, body := range bodies {
		code, h, got := rawCall(t, http.MethodGet, restored+"/v1/keys/"+url.PathEscape(key)+"/result", nil, nil)
		if code != http.StatusOK || h.Get("Idemd-Status") != "201" || !bytes.Equal(got, body) {
			t.Fatalf("GET the restored result of %s: %d, %d bytes; want 200 and the %d bytes put", key, code, len(got), len(body))
		}
		code, _, replayed := rawCall(t, http.MethodPost, restored+"/v1/claim", http.Header{"Content-Type": {"application/json"}}, []byte(`{"key":"`+key+`"}`))
		var c struct {
			Outcome  string `json:"outcome"`
			Response struct {
				Body []byte `json:"body"`
			} `json:"response"`
		}
		if code != http.StatusOK || json.Unmarshal(replayed, &c) != nil || c.Outcome != "completed" || !bytes.Equal(c.Response.Body, body) {
			t.Fatalf("the restored replay of %s: %d %q", key, code, c.Outcome)
		}
	}
	if code, _, _ := rawCall(t, http.MethodGet, restored+"/v1/records/purged", nil, nil); code != http.StatusNotFound {
		t.Fatalf("the key purged before the backup's copy: %d, want 404", code)
	}

	// lookup shows a large result by its size and SHA-256, not its bytes; --json
	// carries them whole.
	sum := sha256.Sum256(bodies["large/1"])
	r = idemctl(map[string]string{"IDEMD_URL": restored}, "lookup", "large/1")
	expect(t, r, exitOK, "lookup")
	if want := fmt.Sprintf("%d bytes, sha256 %x", 3<<20, sum); !strings.Contains(r.stdout, want) || len(r.stdout) > 4096 {
		t.Fatalf("lookup of a 3 MiB result: %.1000s; want %q and not its bytes", r.stdout, want)
	}
	r = idemctl(map[string]string{"IDEMD_URL": restored}, "lookup", "large/1", "--json")
	expect(t, r, exitOK, "lookup --json")
	var rec struct {
		Response struct {
			Body []byte `json:"body"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || !bytes.Equal(rec.Response.Body, bodies["large/1"]) {
		t.Fatalf("lookup --json of a 3 MiB result: %d bytes, %v", len(rec.Response.Body), err)
	}
}
