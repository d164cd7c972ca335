package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testdaemon"
	release "github.com/idemd/idemd/internal/version"

	"github.com/idemd/idemd/internal/testing/wait"
)

// buildStamped compiles the daemon with a version and commit stamped as a release
// build stamps them.
func buildStamped(t *testing.T, version, commit string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idemd")
	ldflags := fmt.Sprintf("-X main.version=%s -X main.commit=%s", version, commit)
	out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestPlainBuildNamesTheRelease builds idemd as a newcomer would, with go build and no
// flags, and expects --version to name the release the tree is, not "(devel)".
func TestPlainBuildNamesTheRelease(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	code, out := runToExit(t, bin, daemonEnv(), "--version")
	want := "idemd " + release.Release + " (contract " + release.Contract + ", commit "
	if code != 0 || !strings.HasPrefix(out, want) {
		t.Fatalf("--version of a plain build: exit %d, %q; want it to start %q", code, out, want)
	}
}

// daemonEnv is the test process's environment without any IDEMD_ or OTEL_ variable,
// which would configure the daemon, plus vars.
func daemonEnv(vars ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return append(env, vars...)
}

// runToExit runs the binary that should refuse to start and returns its exit code and
// output.
func runToExit(t *testing.T, bin string, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait.Scale(time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return 0, string(out)
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBinaryConfiguration runs the real binary configured by its environment: the
// variables set what no flag gives, a flag beats its variable, and --version and
// idemd_build_info report the stamped build.
func TestBinaryConfiguration(t *testing.T) {
	bin := buildStamped(t, "v9.8.7-test", "0123456789ab")
	wantBuild := fmt.Sprintf("idemd v9.8.7-test (contract %s, commit 0123456789ab, %s)", release.Contract, runtime.Version())

	t.Run("version", func(t *testing.T) {
		code, out := runToExit(t, bin, daemonEnv(), "--version")
		if code != 0 || strings.TrimSpace(out) != wantBuild {
			t.Fatalf("--version: exit %d, %q; want %q", code, out, wantBuild)
		}
	})

	t.Run("environment sets flags, flags beat it", func(t *testing.T) {
		dataDir := filepath.Join(t.TempDir(), "from-env")
		addr := testdaemon.FreeAddr(t)
		p := &process{base: "http://" + addr, logs: &strings.Builder{}}
		// The variable's address is not one this test could serve on: the flag must win.
		// Without a blob store (which the embedded store has by default), a result over
		// --max-response-bytes is refused.
		p.cmd = exec.Command(bin, "--listen", addr)
		p.cmd.Env = daemonEnv("IDEMD_LISTEN=192.0.2.1:1", "IDEMD_DATA_DIR="+dataDir, "IDEMD_BLOB_STORE=none",
			"IDEMD_MAX_RESPONSE_BYTES=100", "IDEMD_LOG_LEVEL=warn", "IDEMD_REQUIRE_NOEVICTION=true")
		// The process writes its logs while the test reads them.
		logs := &syncBuffer{}
		p.cmd.Stdout, p.cmd.Stderr = logs, logs
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.kill(t) })
		waitReady(t, p)

		if _, err := os.Stat(filepath.Join(dataDir, "idemd.db")); err != nil {
			t.Fatalf("IDEMD_DATA_DIR was not used: %v", err)
		}
		code, claimed := p.call(t, "/v1/claim", map[string]any{"key": "env-1"})
		if code != http.StatusCreated {
			t.Fatalf("claim: %d %v", code, claimed)
		}
		code, refused := p.call(t, "/v1/complete", map[string]any{"key": "env-1", "lease_token": claimed["lease_token"],
			"response": map[string]any{"status": 200, "body": bytes.Repeat([]byte("x"), 200)}})
		if code != http.StatusRequestEntityTooLarge {
			t.Fatalf("a 200-byte response under IDEMD_MAX_RESPONSE_BYTES=100: %d %v", code, refused)
		}
		if strings.Contains(logs.String(), `"level":"INFO"`) {
			t.Fatalf("IDEMD_LOG_LEVEL=warn was not used:\n%s", logs)
		}

		metrics := scrape(t, p.base)
		want := fmt.Sprintf(`idemd_build_info{commit="0123456789ab",contract=%q,goversion=%q,version="v9.8.7-test"} 1`, release.Contract, runtime.Version())
		if !strings.Contains(metrics, want+"\n") {
			t.Fatalf("/metrics lacks %s", want)
		}
	})

	t.Run("bad values name the flag and the variable", func(t *testing.T) {
		dir := t.TempDir()
		for _, tc := range []struct {
			name     string
			env      string
			args     []string
			exitCode int
			want     []string
		}{
			{"unparsable duration", "IDEMD_RETENTION=banana", nil, 2, []string{"--retention", "IDEMD_RETENTION", "banana"}},
			{"duration out of range", "IDEMD_RETENTION=800h", nil, 2, []string{"--retention must be between", "IDEMD_RETENTION"}},
			{"not a boolean", "IDEMD_REQUIRE_NOEVICTION=perhaps", nil, 2, []string{"--require-noeviction", "IDEMD_REQUIRE_NOEVICTION"}},
			{"not a number", "IDEMD_MAX_RESPONSE_BYTES=1MB", nil, 2, []string{"--max-response-bytes", "IDEMD_MAX_RESPONSE_BYTES"}},
			{"unknown log level", "IDEMD_LOG_LEVEL=loud", nil, 2, []string{"--log-level", "IDEMD_LOG_LEVEL"}},
			{"half a TLS pair", "IDEMD_TLS_CERT=/nonexistent/cert.pem", nil, 2, []string{"--tls-cert", "IDEMD_TLS_CERT"}},
			{"unknown store scheme", "IDEMD_STORE=memcached://127.0.0.1:1", nil, 1, []string{"--store", "IDEMD_STORE"}},
			{"missing auth file", "IDEMD_AUTH_FILE=" + filepath.Join(dir, "missing.yaml"), nil, 1, []string{"--auth-file", "IDEMD_AUTH_FILE"}},
			{"the flag's own error is not blamed on a variable", "IDEMD_STORE=", []string{"--retention", "800h"}, 2, []string{"--retention must be between"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				args := append([]string{"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data")}, tc.args...)
				code, out := runToExit(t, bin, daemonEnv(tc.env), args...)
				if code != tc.exitCode {
					t.Fatalf("exit %d, want %d:\n%s", code, tc.exitCode, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("the error does not say %q:\n%s", w, out)
					}
				}
				if len(tc.args) > 0 && strings.Contains(out, "IDEMD_") {
					t.Errorf("an error about a flag blames a variable:\n%s", out)
				}
			})
		}
	})

	t.Run("a flag beats a bad variable", func(t *testing.T) {
		code, out := runToExit(t, bin, daemonEnv("IDEMD_RETENTION=banana", "IDEMD_LOG_LEVEL=loud"), "--retention", "1h", "--log-level", "warn", "--version")
		if code != 0 || strings.TrimSpace(out) != wantBuild {
			t.Fatalf("exit %d: %s", code, out)
		}
	})
}

// waitReady waits until the process answers /readyz, or fails if it exits.
func waitReady(t *testing.T, p *process) {
	t.Helper()
	err := wait.Until(20*time.Second, func() error {
		resp, err := http.Get(p.base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("daemon not ready: %v\n%s", err, p.logs)
	}
}

// TestEnvironmentNames pins the variable of each flag and the precedence, in process.
func TestEnvironmentNames(t *testing.T) {
	env := map[string]string{
		"IDEMD_REDIS_REPLICA_ACKS":    "2",
		"IDEMD_REDIS_REPLICA_TIMEOUT": "1s",
		"IDEMD_SHUTDOWN_TIMEOUT":      "3s",
		"IDEMD_LISTEN":                "127.0.0.1:9999",
		"IDEMD_DATA_DIR":              "",
	}
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	t.Cleanup(func() { lookupEnv = os.LookupEnv })

	m := NewMain()
	if err := m.ParseFlags([]string{"--shutdown-timeout=7s", "-listen", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	if m.ReplicaAcks != 2 || m.ReplicaTimeout != time.Second {
		t.Errorf("replica flags from the environment: %d %s", m.ReplicaAcks, m.ReplicaTimeout)
	}
	if m.ShutdownTimeout != 7*time.Second || m.Listen != "127.0.0.1:0" {
		t.Errorf("flags did not beat their variables: %s %s", m.ShutdownTimeout, m.Listen)
	}
	if m.DataDir != "idemd-data" {
		t.Errorf("an empty IDEMD_DATA_DIR changed --data-dir to %q", m.DataDir)
	}
}
