package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// TestBackupRestore backs up a daemon while one client completes keys one after the
// other, checks the copy, restores it into a data directory and starts a daemon on it:
// the keys it holds are a prefix of the ones claimed, each completed but perhaps the
// last, and every key completed before the backup began is there.
func TestBackupRestore(t *testing.T) {
	opsToken, opsEntry := newToken(t, "team", "use,admin,platform", "ops")
	teamToken, teamEntry := newToken(t, "team", "use,admin", "team-oncall")
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, authPath, "tenants:\n  team: {}\ntokens:\n"+opsEntry+teamEntry)
	base := startDaemon(t, "--auth-file", authPath, "--data-dir", t.TempDir())
	ops := map[string]string{"IDEMD_URL": base, "IDEMD_TOKEN": opsToken}

	client, err := idem.New(base, idem.WithToken(opsToken), idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var done atomic.Int64 // keys 0 .. done-1 are completed and acknowledged
	complete := func(i int64) error {
		_, err := client.Do(ctx, fmt.Sprintf("k-%06d", i), "", func(context.Context) (idem.Response, error) {
			return idem.Response{Status: 201, Body: []byte(fmt.Sprint(i))}, nil
		})
		return err
	}
	for ; done.Load() < 200; done.Add(1) {
		if err := complete(done.Load()); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for i := done.Load(); i < 1_000_000; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			if err := complete(i); err != nil {
				writerDone <- err
				return
			}
			done.Store(i + 1)
		}
		writerDone <- nil
	}()

	dir := t.TempDir()
	file := filepath.Join(dir, "idemd.backup")
	before := done.Load()
	r := idemctl(map[string]string{"IDEMD_URL": base, "IDEMD_TOKEN": teamToken}, "backup", "--out", file)
	expect(t, r, exitRefused, "backup without the platform scope")
	if !strings.Contains(r.stderr, "403") || !strings.Contains(r.stderr, "platform") {
		t.Fatalf("backup without the platform scope: %s", r.stderr)
	}
	r = idemctl(ops, "backup", "--out", file, "--json")
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	expect(t, r, exitOK, "backup")
	out := r.json(t)
	if out["records"].(float64) < float64(before) {
		t.Fatalf("backup: %v, want at least the %d records completed before it", out, before)
	}
	sidecar, err := os.ReadFile(file + ".sha256")
	if err != nil || !strings.HasPrefix(string(sidecar), out["sha256"].(string)+"  idemd.backup") {
		t.Fatalf("the checksum file: %q, %v", sidecar, err)
	}
	expect(t, idemctl(nil, "backup", "verify", file), exitOK, "verify")

	// A copy changed after the backup is refused, and restores nothing.
	damaged := filepath.Join(dir, "damaged.backup")
	copyBytes, _ := os.ReadFile(file)
	copyBytes[len(copyBytes)/2] ^= 0xff
	writeFile(t, damaged, string(copyBytes))
	writeFile(t, damaged+".sha256", string(sidecar))
	r = idemctl(nil, "backup", "verify", damaged)
	expect(t, r, exitRefused, "verify of a changed copy")
	dataDir := filepath.Join(dir, "restored")
	r = idemctl(nil, "restore", damaged, "--data-dir", dataDir)
	expect(t, r, exitRefused, "restore of a changed copy")
	if _, err := os.Stat(filepath.Join(dataDir, "idemd.db")); !os.IsNotExist(err) {
		t.Fatalf("a refused restore left a database: %v", err)
	}

	// A copy whose digest did not travel with it: bbolt's check of its pages passes a
	// changed byte of a record's data, so the check says it could not check the data and
	// refuses, unless told that pages are enough or given the digest.
	alone := filepath.Join(t.TempDir(), "alone.backup")
	body := []byte(`"` + base64.StdEncoding.EncodeToString([]byte("150")) + `"`)
	changed, err := os.ReadFile(file)
	if err != nil || bytes.Count(changed, body) != 1 {
		t.Fatalf("the copy holds key 150's body %s not exactly once: %v", body, err)
	}
	at := bytes.Index(changed, body)
	changed[at+1] = 'N' // still base64, still a record, another body
	writeFile(t, alone, string(changed))
	r = idemctl(nil, "backup", "verify", alone)
	expect(t, r, exitRefused, "verify of a changed copy without its digest")
	if !strings.Contains(r.stderr, "--pages-only") || !strings.Contains(r.stderr, ".sha256") {
		t.Fatalf("verify without the digest does not say what it could not check: %s", r.stderr)
	}
	r = idemctl(nil, "backup", "verify", alone, "--sha256", out["sha256"].(string))
	expect(t, r, exitRefused, "verify of a changed copy against the digest given")
	r = idemctl(nil, "backup", "verify", alone, "--pages-only")
	expect(t, r, exitOK, "verify of the pages alone")
	if !strings.Contains(r.stdout, "pages only") {
		t.Fatalf("verify --pages-only does not say it checked pages only: %s", r.stdout)
	}
	r = idemctl(nil, "restore", alone, "--data-dir", filepath.Join(dir, "from-alone"))
	expect(t, r, exitRefused, "restore of a copy without its digest")
	pristine := filepath.Join(t.TempDir(), "pristine.backup")
	original, _ := os.ReadFile(file)
	writeFile(t, pristine, string(original))
	expect(t, idemctl(nil, "backup", "verify", pristine, "--sha256", out["sha256"].(string)), exitOK, "verify against the digest given")

	expect(t, idemctl(nil, "restore", file, "--data-dir", dataDir), exitOK, "restore")
	r = idemctl(nil, "restore", file, "--data-dir", dataDir)
	expect(t, r, exitRefused, "restore over a database")
	if !strings.Contains(r.stderr, "--replace") {
		t.Fatalf("restore over a database: %s", r.stderr)
	}

	restored := startDaemon(t, "--auth-file", authPath, "--data-dir", dataDir)
	r = idemctl(map[string]string{"IDEMD_URL": restored, "IDEMD_TOKEN": opsToken}, "restore", file, "--data-dir", dataDir, "--replace")
	expect(t, r, exitRefused, "restore over a database in use")
	rc, err := idem.New(restored, idem.WithToken(opsToken), idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	// The copy is one moment's: the keys it holds are 0 .. n-1, each with its result,
	// but for the last, which the client may have claimed and not yet completed then.
	n := int64(out["records"].(float64))
	for i := int64(0); i < n; i++ {
		rec, err := rc.Lookup(ctx, fmt.Sprintf("k-%06d", i))
		switch {
		case err == nil && i == n-1 && rec.State == "pending":
		case err != nil || rec.State != "completed" || string(rec.Response.Body) != fmt.Sprint(i):
			t.Fatalf("key %d of the %d the copy holds: %+v, %v", i, n, rec, err)
		}
	}
	if _, err := rc.Lookup(ctx, fmt.Sprintf("k-%06d", n)); err == nil {
		t.Fatalf("the copy holds key %d beyond its %d records", n, n)
	}

	// A daemon on Redis has no file to copy.
	srv := testredis.Start(t)
	onRedis := startDaemon(t, "--auth-file", authPath, "--store", srv.URL())
	r = idemctl(map[string]string{"IDEMD_URL": onRedis, "IDEMD_TOKEN": opsToken}, "backup", "--out", filepath.Join(dir, "redis.backup"))
	expect(t, r, exitRefused, "backup of a daemon on Redis")
	if !strings.Contains(r.stderr, "not_supported") {
		t.Fatalf("backup of a daemon on Redis: %s", r.stderr)
	}
}
