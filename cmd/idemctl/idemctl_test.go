package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/wait"
)

// binaries are the idemd and idemctl commands built from this repository, once per
// test process.
var binaries struct {
	dir            string
	idemd, idemctl string
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaries.dir = dir
	binaries.idemd, binaries.idemctl = filepath.Join(dir, "idemd"), filepath.Join(dir, "idemctl")
	for bin, pkg := range map[string]string{binaries.idemd: "../idemd", binaries.idemctl: "."} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startDaemon runs the idemd binary on the embedded store, with the extra flags, until
// the test ends.
func startDaemon(t *testing.T, flags ...string) string {
	t.Helper()
	return testdaemon.Start(t, binaries.idemd, "/readyz", append([]string{"--log-level", "warn"}, flags...)...)
}

// result is one idemctl run.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) json(t *testing.T) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	return out
}

// idemctl runs the command in process with the given environment variables only.
func idemctl(env map[string]string, args ...string) result {
	var stdout, stderr bytes.Buffer
	code := run(args, func(k string) string { return env[k] }, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// expect fails the test unless the run ended with code.
func expect(t *testing.T, r result, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r.code, code, r.stdout, r.stderr)
	}
}

// newToken makes a token with `token new --json` and returns it and its entry.
func newToken(t *testing.T, tenant, scopes, name string) (string, string) {
	t.Helper()
	r := idemctl(nil, "token", "new", "--tenant", tenant, "--scopes", scopes, "--name", name, "--json")
	expect(t, r, exitOK, "token new")
	out := r.json(t)
	token, entry := out["token"].(string), out["entry"].(string)
	if len(token) != 64 || strings.Contains(entry, token) || !strings.Contains(entry, out["sha256"].(string)) {
		t.Fatalf("token new: %v", out)
	}
	return token, entry
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRecordsEndToEnd makes tokens with idemctl, checks the auth file holding them,
// starts idemd on it, and walks keys through every transition with idemctl.
func TestRecordsEndToEnd(t *testing.T) {
	useToken, useEntry := newToken(t, "team", "use", "team-api")
	adminToken, adminEntry := newToken(t, "team", "use,admin", "team-oncall")
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, authPath, "tenants:\n  team: {}\ntokens:\n"+useEntry+adminEntry)
	r := idemctl(nil, "auth", "check", authPath)
	expect(t, r, exitOK, "auth check")
	if !strings.Contains(r.stdout, "valid, 2 tokens in 1 tenants (team)") {
		t.Fatalf("auth check: %s", r.stdout)
	}

	base := startDaemon(t, "--auth-file", authPath)
	env := map[string]string{"IDEMD_URL": base, "IDEMD_TOKEN": useToken}

	r = idemctl(env, "lookup", "order-1")
	expect(t, r, exitNotFound, "lookup of a fresh key")
	if !strings.Contains(r.stderr, "404") || !strings.Contains(r.stderr, "not_found") {
		t.Fatalf("lookup of a fresh key: %s", r.stderr)
	}
	r = idemctl(env, "lookup", "order-1", "--json")
	expect(t, r, exitNotFound, "lookup --json of a fresh key")
	if p := r.json(t); p["code"] != "not_found" || p["status"] != float64(404) || p["title"] == "" {
		t.Fatalf("problem details: %v", p)
	}

	r = idemctl(env, "claim", "order-1", "--fingerprint", "f1", "--lease", "1m", "--json")
	expect(t, r, exitOK, "claim")
	claimed := r.json(t)
	lease, _ := claimed["lease_token"].(string)
	if claimed["outcome"] != "acquired" || lease == "" || claimed["attempt"] != float64(1) {
		t.Fatalf("claim: %v", claimed)
	}
	r = idemctl(env, "claim", "order-1", "--fingerprint", "f1")
	expect(t, r, exitRefused, "a second claim while the lease lives")
	if !strings.Contains(r.stderr, "in_progress") || !strings.Contains(r.stderr, "retry after") {
		t.Fatalf("a second claim: %s", r.stderr)
	}
	r = idemctl(env, "claim", "order-1", "--fingerprint", "f1", "--secret", claimed["claim_secret"].(string), "--json")
	expect(t, r, exitOK, "a claim resent with its secret")
	if again := r.json(t); again["outcome"] != "acquired" || again["lease_token"] != lease {
		t.Fatalf("a claim resent with its secret: %v, want the lease %s back", again, lease)
	}
	r = idemctl(env, "lookup", "--json", "order-1")
	expect(t, r, exitOK, "lookup of a pending key")
	if rec := r.json(t); rec["state"] != "pending" || rec["fingerprint"] != "f1" || rec["lease_expires_at"] == nil {
		t.Fatalf("lookup of a pending key: %v", rec)
	}

	r = idemctl(env, "complete", "order-1", "--lease-token", lease, "--status", "201",
		"--header", "Content-Type: application/json", "--body", `{"id":42}`)
	expect(t, r, exitOK, "complete")
	r = idemctl(env, "claim", "order-1", "--fingerprint", "f1", "--json")
	expect(t, r, exitOK, "claim of a completed key")
	replay := r.json(t)
	resp, _ := replay["response"].(map[string]any)
	if replay["outcome"] != "completed" || resp["status"] != float64(201) ||
		resp["body"] != base64.StdEncoding.EncodeToString([]byte(`{"id":42}`)) {
		t.Fatalf("replay: %v", replay)
	}
	if h, _ := resp["headers"].(map[string]any); fmt.Sprint(h["Content-Type"]) != "[application/json]" {
		t.Fatalf("replayed headers: %v", resp["headers"])
	}
	r = idemctl(env, "lookup", "order-1")
	expect(t, r, exitOK, "lookup of a completed key")
	for _, want := range []string{"completed", "201", `"{\"id\":42}" (9 bytes)`, "Content-Type: application/json"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("lookup does not show %q:\n%s", want, r.stdout)
		}
	}
	r = idemctl(env, "claim", "order-1", "--fingerprint", "f2")
	expect(t, r, exitRefused, "claim with another fingerprint")
	if !strings.Contains(r.stderr, "fingerprint_mismatch") {
		t.Fatalf("claim with another fingerprint: %s", r.stderr)
	}

	// Purge needs the admin scope; the flag beats IDEMD_TOKEN.
	r = idemctl(env, "purge", "order-1")
	expect(t, r, exitRefused, "purge with a use token")
	if !strings.Contains(r.stderr, "403") || !strings.Contains(r.stderr, "forbidden") {
		t.Fatalf("purge with a use token: %s", r.stderr)
	}
	r = idemctl(env, "purge", "order-1", "--token", adminToken)
	expect(t, r, exitOK, "purge with an admin token")
	expect(t, idemctl(env, "lookup", "order-1"), exitNotFound, "lookup after purge")
	r = idemctl(env, "--token", "not-a-token", "lookup", "order-1", "--json")
	expect(t, r, exitRefused, "lookup with an unknown token")
	if p := r.json(t); p["code"] != "unauthenticated" || p["status"] != float64(401) {
		t.Fatalf("an unknown token: %v", p)
	}

	// release --mode fail stores the failure that later claims replay.
	r = idemctl(env, "claim", "order-2", "--json")
	expect(t, r, exitOK, "claim order-2")
	lease = r.json(t)["lease_token"].(string)
	extended := time.Now().Add(-time.Millisecond) // the daemon counts whole milliseconds
	r = idemctl(env, "extend", "order-2", "--lease-token", lease, "--lease", "2m", "--json")
	expect(t, r, exitOK, "extend")
	if until, err := time.Parse(time.RFC3339Nano, r.json(t)["lease_expires_at"].(string)); err != nil || until.Before(extended.Add(2*time.Minute)) {
		t.Fatalf("extend: %s (%v)", r.stdout, err)
	}
	expect(t, idemctl(env, "release", "order-2", "--lease-token", lease, "--mode", "fail", "--status", "502", "--body", "upstream down"),
		exitOK, "release --mode fail")
	r = idemctl(env, "claim", "order-2", "--json")
	expect(t, r, exitOK, "claim of a failed key")
	if out := r.json(t); out["outcome"] != "failed" || out["response"].(map[string]any)["status"] != float64(502) {
		t.Fatalf("claim of a failed key: %v", out)
	}

	// release --mode retry frees the key for the next attempt.
	r = idemctl(env, "claim", "order-3", "--json")
	expect(t, r, exitOK, "claim order-3")
	lease = r.json(t)["lease_token"].(string)
	r = idemctl(env, "release", "order-3", "--lease-token", lease)
	expect(t, r, exitOK, "release")
	if strings.TrimSpace(r.stdout) != "order-3: released" {
		t.Fatalf("release: %q", r.stdout)
	}
	r = idemctl(env, "claim", "order-3")
	expect(t, r, exitOK, "claim after release")
	hasRow := func(out string, row ...string) bool {
		return slices.ContainsFunc(strings.Split(out, "\n"), func(line string) bool { return slices.Equal(strings.Fields(line), row) })
	}
	if !hasRow(r.stdout, "outcome", "acquired") || !hasRow(r.stdout, "attempt", "2") {
		t.Fatalf("claim after release:\n%s", r.stdout)
	}
	r = idemctl(env, "complete", "order-3", "--lease-token", lease)
	expect(t, r, exitRefused, "complete with the released lease")
	if !strings.Contains(r.stderr, "lease_lost") {
		t.Fatalf("complete with the released lease: %s", r.stderr)
	}
}

func TestUnreachable(t *testing.T) {
	url := "http://" + testdaemon.FreeAddr(t)
	r := idemctl(nil, "--url", url, "lookup", "k")
	expect(t, r, exitUnavailable, "lookup of a daemon that is not there")
	if !strings.Contains(r.stderr, "unavailable") {
		t.Fatalf("stderr: %s", r.stderr)
	}
	r = idemctl(nil, "--url", url, "claim", "k", "--json")
	expect(t, r, exitUnavailable, "claim --json of a daemon that is not there")
	if p := r.json(t); p["title"] == "" || !strings.Contains(p["detail"].(string), "connect") {
		t.Fatalf("problem: %v", p)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "Usage"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"lookup without a key", []string{"lookup"}, "lookup takes one KEY"},
		{"lookup with two keys", []string{"lookup", "a", "b"}, "lookup takes one KEY"},
		{"unknown flag", []string{"lookup", "--colour", "k"}, "colour"},
		{"complete without a lease token", []string{"complete", "k"}, "--lease-token"},
		{"release with a bad mode", []string{"release", "k", "--lease-token", "t", "--mode", "later"}, "--mode"},
		{"complete with a bad status", []string{"complete", "k", "--lease-token", "t", "--status", "42"}, "--status 42"},
		{"a header without a colon", []string{"complete", "k", "--lease-token", "t", "--header", "oops"}, "Name: value"},
		{"token without new", []string{"token"}, "subcommand new"},
		{"token new without a tenant", []string{"token", "new"}, "--tenant"},
		{"token new with an unknown scope", []string{"token", "new", "--tenant", "t", "--scopes", "use,root"}, `unknown scope "root"`},
		{"token new with a bad tenant", []string{"token", "new", "--tenant", "Team"}, "not a valid tenant name"},
		{"auth check without a file", []string{"auth", "check"}, "one FILE"},
		{"bench with a bad mode", []string{"bench", "--mode", "storm"}, "--mode"},
		{"bench without clients", []string{"bench", "--concurrency", "0"}, "positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := idemctl(nil, tc.args...)
			expect(t, r, exitUsage, strings.Join(tc.args, " "))
			if !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("stderr does not say %q:\n%s", tc.want, r.stderr)
			}
		})
	}
	if r := idemctl(nil, "help"); r.code != exitOK || !strings.Contains(r.stdout, "Exit codes") {
		t.Fatalf("help: %d %s", r.code, r.stdout)
	}
}

// daemonVerdict starts idemd on the auth file and returns "" when it serves, or the
// error it stopped with.
func daemonVerdict(t *testing.T, authPath string) string {
	t.Helper()
	addr := testdaemon.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait.Scale(time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, binaries.idemd, "--listen", addr, "--data-dir", t.TempDir(), "--auth-file", authPath)
	cmd.Env = testdaemon.Env()
	logs := &testdaemon.Logs{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	verdict := ""
	wait.For(t, time.Minute, "idemd to serve or to stop", func() bool {
		select {
		case err := <-exited:
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("idemd exited with %v:\n%s", err, logs)
			}
			for line := range strings.SplitSeq(logs.String(), "\n") {
				var entry struct{ Msg, Err string }
				if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "idemd stopped" {
					verdict = entry.Err
					return true
				}
			}
			t.Fatalf("idemd exited without saying why:\n%s", logs)
		default:
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		return true
	})
	return verdict
}

// TestAuthCheckAgreesWithDaemon gives idemctl and idemd the same files: each is
// accepted by both or refused by both, for the same reason.
func TestAuthCheckAgreesWithDaemon(t *testing.T) {
	_, entry := newToken(t, "team", "use", "")
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		valid         bool
	}{
		{"valid", "tenants:\n  team: {rate: 10}\ntokens:\n" + entry, true},
		{"JSON", `{"tenants": {"team": {}}, "tokens": [{"tenant": "team", "scopes": ["use"], "sha256": "` + strings.Repeat("ab", 32) + `"}]}`, true},
		{"undeclared tenant", "tenants:\n  other: {}\ntokens:\n" + entry, false},
		{"short hash", "tenants:\n  team: {}\ntokens:\n  - {tenant: team, scopes: [use], sha256: abc}\n", false},
		{"same hash twice", "tenants:\n  team: {}\ntokens:\n" + entry + entry, false},
		{"unknown field", "tenants:\n  team: {rate_limit: 5}\ntokens:\n" + entry, false},
		{"burst without rate", "tenants:\n  team: {burst: 5}\ntokens:\n" + entry, false},
		{"no tokens", "tenants:\n  team: {}\n", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			writeFile(t, path, tc.content)
			r := idemctl(nil, "auth", "check", path, "--json")
			out := r.json(t)
			daemon := daemonVerdict(t, path)
			if tc.valid {
				expect(t, r, exitOK, "auth check")
				if out["valid"] != true || daemon != "" {
					t.Fatalf("idemctl: %v; idemd: %q", out, daemon)
				}
				return
			}
			expect(t, r, exitRefused, "auth check")
			reason, _ := out["error"].(string)
			if out["valid"] != false || reason == "" || daemon != "--auth-file: "+reason {
				t.Fatalf("idemctl: %q; idemd: %q", reason, daemon)
			}
		})
	}
	r := idemctl(nil, "auth", "check", filepath.Join(dir, "missing.yaml"))
	expect(t, r, exitRefused, "auth check of a missing file")
	if !strings.Contains(r.stderr, "no such file") {
		t.Fatalf("auth check of a missing file: %s", r.stderr)
	}
}

// metricValue reads one sample of the daemon's /metrics, by its exact series.
func metricValue(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return 0
}

// TestBench runs bench in both modes against a real daemon and checks its report
// against the daemon's own counts.
func TestBench(t *testing.T) {
	base := startDaemon(t)
	acquired := `idemd_requests_total{endpoint="POST /v1/claim",outcome="acquired",tenant="default"}`
	completed := `idemd_requests_total{endpoint="POST /v1/claim",outcome="completed",tenant="default"}`

	r := idemctl(nil, "bench", "--url", base, "--concurrency", "4", "--requests", "300", "--json")
	expect(t, r, exitOK, "bench of cycles")
	var res benchResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Operations != 300 || res.Requests != 600 || len(res.Errors) != 0 || res.OpsPerSec <= 0 || res.CPUPerReq <= 0 {
		t.Fatalf("bench of cycles: %+v", res)
	}
	for _, name := range []string{"claim", "complete", "cycle"} {
		l := res.Latency[name]
		if !(l["p50"] > 0 && l["p50"] <= l["p90"] && l["p90"] <= l["p99"] && l["p99"] <= l["p99.9"] && l["p99.9"] <= l["max"]) {
			t.Errorf("%s latency: %v", name, l)
		}
	}
	if got := metricValue(t, base, acquired); got != 300 {
		t.Fatalf("the daemon counted %v acquired claims, want 300", got)
	}

	r = idemctl(nil, "bench", "--url", base, "--mode", "replay", "--keys", "10", "--concurrency", "3", "--requests", "200")
	expect(t, r, exitOK, "bench of replays")
	for _, want := range []string{"3 clients, 200 replays in", "0 errors", "replay", "p99.9", "idemctl's own CPU"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report does not say %q:\n%s", want, r.stdout)
		}
	}
	if got := metricValue(t, base, completed); got != 200 {
		t.Fatalf("the daemon counted %v replays, want 200", got)
	}
}

// TestBenchCountsErrors runs bench with a token the daemon does not know.
func TestBenchCountsErrors(t *testing.T) {
	_, entry := newToken(t, "team", "use", "")
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, authPath, "tenants:\n  team: {}\ntokens:\n"+entry)
	base := startDaemon(t, "--auth-file", authPath)
	r := idemctl(map[string]string{"IDEMD_TOKEN": "wrong"}, "bench", "--url", base, "--concurrency", "2", "--requests", "20", "--json")
	expect(t, r, exitRefused, "bench with an unknown token")
	var res benchResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Operations != 0 || res.Errors["unauthenticated"] != 20 || !strings.Contains(res.FirstError, "401") {
		t.Fatalf("bench with an unknown token: %+v", res)
	}
}

// TestBinary runs the built command: the environment configures it, a flag beats its
// variable, and the exit codes reach the shell.
func TestBinary(t *testing.T) {
	token, entry := newToken(t, "team", "use", "")
	authPath := filepath.Join(t.TempDir(), "auth.yaml")
	writeFile(t, authPath, "tenants:\n  team: {}\ntokens:\n"+entry)
	base := startDaemon(t, "--auth-file", authPath)

	runBinary := func(env []string, args ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), wait.Scale(time.Minute))
		defer cancel()
		cmd := exec.CommandContext(ctx, binaries.idemctl, args...)
		cmd.Env = append(testdaemon.Env(), env...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	env := []string{"IDEMD_URL=" + base, "IDEMD_TOKEN=" + token}
	if code, out := runBinary(env, "lookup", "k"); code != exitNotFound {
		t.Fatalf("lookup with IDEMD_URL and IDEMD_TOKEN: exit %d\n%s", code, out)
	}
	if code, out := runBinary(env, "--token", "wrong", "lookup", "k"); code != exitRefused || !strings.Contains(out, "unauthenticated") {
		t.Fatalf("--token beats IDEMD_TOKEN: exit %d\n%s", code, out)
	}
	if code, out := runBinary(env, "claim", "k"); code != exitOK || !strings.Contains(out, "acquired") {
		t.Fatalf("claim: exit %d\n%s", code, out)
	}
	if code, out := runBinary(nil, "version"); code != exitOK || !strings.HasPrefix(out, "idemctl ") {
		t.Fatalf("version: exit %d\n%s", code, out)
	}
	if code, _ := runBinary(nil, "lookup"); code != exitUsage {
		t.Fatalf("lookup without a key: exit %d", code)
	}
}
