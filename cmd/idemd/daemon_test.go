package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

func startMain(t *testing.T, args ...string) (*Main, context.CancelFunc, chan error) {
	t.Helper()
	m := NewMain()
	if err := m.ParseFlags(append([]string{"--listen", "127.0.0.1:0", "--log-level", "warn"}, args...)); err != nil {
		t.Fatal(err)
	}
	if err := m.Open(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m, cancel, done
}

func post(url, body string) (int, string, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestGracefulShutdown cancels the daemon while a claim is waiting far longer than the
// shutdown timeout: the waiter must be answered at once, as if its wait had run out
// (409 with Retry-After), so that the drain finishes; new connections must be
// refused, and Run must return without error.
func TestGracefulShutdown(t *testing.T) {
	r := testredis.Start(t)
	m, stop, done := startMain(t, "--store", r.URL(), "--shutdown-timeout", "3s")
	base := "http://" + m.Addr()
	if code, body, err := post(base+"/v1/claim", `{"key":"held","lease_ms":60000}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}

	type answer struct {
		code       int
		retryAfter string
		err        error
	}
	inflight := make(chan answer, 1)
	go func() {
		resp, err := http.Post(base+"/v1/claim", "application/json", strings.NewReader(`{"key":"held","wait_ms":30000}`))
		if err != nil {
			inflight <- answer{err: err}
			return
		}
		resp.Body.Close()
		inflight <- answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	}()
	// Wait until the daemon counts the waiter, so shutdown finds it in flight.
	wait.For(t, 10*time.Second, "the daemon to count the waiting claim", func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), "idemd_claim_waiters 1\n")
	})
	stop()
	if a := <-inflight; a.err != nil || a.code != http.StatusConflict || a.retryAfter == "" {
		t.Fatalf("waiting claim during shutdown: %d, Retry-After %q, %v; want 409 with Retry-After", a.code, a.retryAfter, a.err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, _, err := post(base+"/v1/claim", `{"key":"after"}`); err == nil {
		t.Fatal("the daemon still accepts requests after shutdown")
	}
}

func TestFlagsRefuseNonsense(t *testing.T) {
	for _, args := range [][]string{
		{"--max-response-bytes", "0"},
		{"--max-recovery-point-bytes", "0"},
		{"--retention", "0s"},
		{"--retention", "800h"},
		{"--log-level", "loud"},
		{"--store-timeout", "0s"},
		{"--body-timeout", "0s"},
		{"--write-timeout", "-1s"},
		{"--redis-replica-acks", "1", "--redis-replica-timeout", "2s", "--store-timeout", "1s"},
		{"--redis-pipelines", "0"},
		{"--redis-record-layout", "compact"},
		{"--redis-hash-records", "--redis-record-layout", "lean"},
		{"--redis-record-layout", ""},
		{"stray"},
		{"--blob-store", "ftp://host/dir"},
		{"--blob-store", "file://host/dir"},
		{"--blob-store", "s3:///prefix"},
		{"--blob-store", "s3://bucket/p?colour=blue"},
		{"--blob-store", "s3://bucket/p?endpoint=localhost:9000"},
		{"--blob-store", "file:", "--blob-threshold", "0"},
		{"--blob-store", "file:", "--blob-threshold", "2000000"},
		{"--blob-store", "file:", "--max-blob-bytes", "1000"},
		{"--blob-store", "file:", "--blob-sweep-every", "0s"},
		// 2×2s + 64×250ms + 1s = 21s at the least.
		{"--blob-store", "file:", "--blob-sweep-grace", "20s"},
		{"--blob-store", "file:", "--store-timeout", "1m", "--blob-sweep-grace", "2m"},
	} {
		if err := NewMain().ParseFlags(args); err == nil {
			t.Errorf("ParseFlags(%q) accepted", args)
		}
	}
}

// TestBlobSweepGraceCoversTheWrite: a sweep's grace is at least the longest a
// completion may take from naming its blob to storing its record; the default grows
// to it, a grace given shorter is refused (TestFlagsRefuseNonsense).
func TestBlobSweepGraceCoversTheWrite(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"--blob-store", "file:"}, engine.BlobSweepGrace},
		{[]string{"--blob-store", "file:", "--blob-sweep-grace", "21s"}, 21 * time.Second},
		{[]string{"--blob-store", "file:", "--store-timeout", "1s", "--max-blob-bytes", "1048576", "--blob-sweep-grace", "3250ms"}, 3250 * time.Millisecond},
		{[]string{"--blob-store", "file:", "--store-timeout", "5m"}, 10*time.Minute + 17*time.Second},
	} {
		m := NewMain()
		if err := m.ParseFlags(c.args); err != nil {
			t.Fatalf("ParseFlags(%q): %v", c.args, err)
		}
		if m.BlobSweepGrace != c.want {
			t.Errorf("ParseFlags(%q): the sweep's grace is %s, want %s", c.args, m.BlobSweepGrace, c.want)
		}
	}
}

// TestBlobStoreURLKeepsCredentialsOut refuses a blob store URL with credentials in it,
// and the refusal does not repeat them.
func TestBlobStoreURLKeepsCredentialsOut(t *testing.T) {
	for _, u := range []string{
		"s3://AKIDXYZZY:wJalrXYZZYKEY@bucket/prefix?region=eu-west-1",
		"s3://bucket/prefix?endpoint=http://AKIDXYZZY:wJalrXYZZYKEY@127.0.0.1:9000",
		"file://AKIDXYZZY:wJalrXYZZYKEY@/dir",
	} {
		err := NewMain().ParseFlags([]string{"--blob-store", u})
		if err == nil {
			t.Fatalf("--blob-store %s was taken", u)
		}
		if strings.Contains(err.Error(), "XYZZY") {
			t.Fatalf("the refusal repeats the credentials: %v", err)
		}
	}
	if err := NewMain().ParseFlags([]string{"--blob-store", "s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=true"}); err != nil {
		t.Fatalf("a plain s3 URL: %v", err)
	}
}

// TestRequireNoeviction starts the daemon on a Redis that evicts keys: a warning by
// default, a refusal with --require-noeviction.
func TestRequireNoeviction(t *testing.T) {
	r := testredis.Start(t, "--maxmemory-policy", "allkeys-lru")
	m := NewMain()
	if err := m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--store", r.URL(), "--require-noeviction"}); err != nil {
		t.Fatal(err)
	}
	err := m.Open()
	if err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("Open on an evicting Redis with --require-noeviction: %v", err)
	}
	// Without the flag it starts and serves.
	started, _, _ := startMain(t, "--store", r.URL())
	if code, body, err := post("http://"+started.Addr()+"/v1/claim", `{"key":"evicting"}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}
}

// TestLeanRecordLayout: with --redis-record-layout lean the daemon keeps its records at
// their lean keys, and still answers for a record an earlier layout wrote.
func TestLeanRecordLayout(t *testing.T) {
	r := testredis.Start(t)
	earlier, _, _ := startMain(t, "--store", r.URL(), "--redis-record-layout", "strings")
	if code, body, err := post("http://"+earlier.Addr()+"/v1/claim", `{"key":"before"}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}
	lean, _, _ := startMain(t, "--store", r.URL(), "--redis-record-layout", "lean")
	if code, body, err := post("http://"+lean.Addr()+"/v1/claim", `{"key":"before"}`); err != nil || code != 409 {
		t.Fatalf("a claim of a key held under the earlier layout: %d %s %v, want 409", code, body, err)
	}
	if code, body, err := post("http://"+lean.Addr()+"/v1/claim", `{"key":"after"}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}
	client, err := redisstore.NewClient(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "after"}
	if n, err := client.Exists(t.Context(), redisstore.LeanKey(id), redisstore.RecordKey(id)).Result(); err != nil || n != 1 {
		t.Fatalf("keys of the lean record: %d, %v", n, err)
	}
	if n, err := client.Exists(t.Context(), redisstore.LeanKey(id)).Result(); err != nil || n != 1 {
		t.Fatalf("the lean key: %d, %v", n, err)
	}
}

// TestStartErrorsComeFromOpen: every way start-up can fail is Open's error, after
// which Addr answers "" at once (it used to wait forever for a listener that never
// came), Close is harmless and Run refuses to serve.
func TestStartErrorsComeFromOpen(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	authFile := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(authFile, []byte("tenants: {a: {}}\n---\ngarbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown store scheme", []string{"--store", "memcached://127.0.0.1:1"}, "unknown scheme"},
		{"relative bolt path", []string{"--store", "bolt://idemd.db"}, "absolute path"},
		{"cluster URL without nodes", []string{"--store", "redis+cluster://"}, "no cluster nodes"},
		{"broken auth file", []string{"--data-dir", t.TempDir(), "--auth-file", authFile}, "--auth-file"},
		{"missing TLS key pair", []string{"--data-dir", t.TempDir(), "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"}, "--tls-cert"},
		{"address in use", []string{"--data-dir", t.TempDir(), "--listen", busy.Addr().String()}, "address already in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMain()
			if err := m.ParseFlags(append([]string{"--listen", "127.0.0.1:0", "--log-level", "error"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			err := m.Open()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want an error mentioning %q", err, tc.want)
			}
			if addr := m.Addr(); addr != "" {
				t.Errorf("Addr after a failed Open = %q", addr)
			}
			if err := m.Run(t.Context()); err == nil {
				t.Error("Run after a failed Open served")
			}
			if err := m.Close(); err != nil {
				t.Errorf("Close after a failed Open: %v", err)
			}
		})
	}
}

// TestMalformedPathIsAProblem: the daemon answers a path it cannot unescape with
// problem+json, not net/http's plain text.
func TestMalformedPathIsAProblem(t *testing.T) {
	m, _, _ := startMain(t, "--data-dir", t.TempDir())
	conn, err := net.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /v1/records/%zz HTTP/1.1\r\nHost: idemd\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), `"code":"invalid_request"`) {
		t.Fatalf("GET /v1/records/%%zz: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}
