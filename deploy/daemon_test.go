package deploy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/wait"
)

var (
	buildOnce sync.Once
	idemdBin  string
	buildErr  error
)

// idemd builds the daemon once per test process.
func idemd(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemd-deploy-test-")
		if err != nil {
			buildErr = err
			return
		}
		idemdBin = filepath.Join(dir, "idemd")
		if out, err := exec.Command("go", "build", "-o", idemdBin, "../cmd/idemd").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return idemdBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if idemdBin != "" {
		os.RemoveAll(filepath.Dir(idemdBin))
	}
	os.Exit(code)
}

// startDaemon runs the idemd binary with flags until the test ends, and returns its
// base URL once it answers /healthz (it may not be ready, if its store is down).
func startDaemon(t *testing.T, flags ...string) string {
	t.Helper()
	return testdaemon.Start(t, idemd(t), "/healthz", append([]string{"--log-level", "error"}, flags...)...)
}

// call sends one JSON request and returns the status.
func call(t *testing.T, base, method, path, token, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: wait.Scale(time.Minute)}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// series is what /metrics exports: for each sample name, the label names its samples
// carry.
type series map[string]map[string]bool

// scrape reads a daemon's /metrics in the text format.
func scrape(t *testing.T, base string, into series) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name = strings.Fields(name)[0]
		if into[name] == nil {
			into[name] = map[string]bool{}
		}
		if labels, _, ok := strings.Cut(rest, "}"); ok {
			for _, pair := range splitLabels(labels) {
				if k, _, ok := strings.Cut(pair, "="); ok {
					into[name][k] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// splitLabels splits a label set at the commas outside quoted values.
func splitLabels(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, escaped := false, false
	for _, r := range s {
		switch {
		case escaped:
			escaped = false
		case r == '\\':
			escaped = true
		case r == '"':
			quoted = !quoted
		case r == ',' && !quoted:
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteRune(r)
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// exported runs real daemons and makes them export every series idemd has: a daemon on
// the embedded store with tenants, tokens and a rate limit, driven through acquired,
// replayed, refused, rate-limited and taken-over claims; and a daemon whose Redis is
// unreachable, for the store's errors.
func exported(t *testing.T) series {
	t.Helper()
	dir := t.TempDir()
	authPath := filepath.Join(dir, "auth.yaml")
	auth := "tenants:\n  team: {max_stored_bytes: 1000000, max_records: 1000}\n  tiny: {rate: 1, burst: 1}\ntokens:\n" +
		"  - {tenant: team, scopes: [use, admin], sha256: " + sha256Hex("team-token") + "}\n" +
		"  - {tenant: tiny, scopes: [use], sha256: " + sha256Hex("tiny-token") + "}\n"
	if err := os.WriteFile(authPath, []byte(auth), 0o600); err != nil {
		t.Fatal(err)
	}
	// The per-tenant usage series, which the quota alert reads, go to an open scrape
	// only when the operator says so.
	embedded := startDaemon(t, "--auth-file", authPath, "--blob-store", "file:", "--metrics-tenant-usage")
	if code := call(t, embedded, "POST", "/v1/claim", "team-token", `{"key":"a","lease_ms":100}`); code != http.StatusCreated {
		t.Fatalf("claim: %d", code)
	}
	// Taken over once the 100ms lease has run out.
	wait.For(t, 10*time.Second, "a claim to take the expired lease over", func() bool {
		return call(t, embedded, "POST", "/v1/claim", "team-token", `{"key":"a"}`) == http.StatusCreated
	})
	call(t, embedded, "POST", "/v1/claim", "team-token", `{"key":"a"}`)             // in_progress
	call(t, embedded, "POST", "/v1/claim", "team-token", `{"key":"b","wait_ms":1}`) // acquired after no wait
	call(t, embedded, "GET", "/v1/records/a", "", "")                               // unauthenticated
	// The tiny tenant's burst is one request.
	for i := 0; i < 10 && call(t, embedded, "GET", "/v1/records/x", "tiny-token", "") != http.StatusTooManyRequests; i++ {
	}

	store := startDaemon(t, "--store", "redis://"+testdaemon.FreeAddr(t)+"/0")
	if code := call(t, store, "POST", "/v1/claim", "", `{"key":"a"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("claim over an unreachable Redis: %d, want 503", code)
	}

	got := series{}
	scrape(t, embedded, got)
	scrape(t, store, got)
	for _, name := range []string{"idemd_lease_takeovers_total", "idemd_store_errors_total", "idemd_bolt_db_size_bytes", "idemd_build_info", "idemd_blob_errors_total"} {
		if got[name] == nil {
			t.Fatalf("the daemons did not export %s", name)
		}
	}
	return got
}
