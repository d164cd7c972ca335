package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/wait"
)

// buildDaemon compiles this command into a temporary binary.
func buildDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idemd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// process is a daemon binary running on the embedded store.
type process struct {
	cmd  *exec.Cmd
	base string
	logs *strings.Builder
}

func startBinary(t *testing.T, bin, dataDir, addr string) *process {
	t.Helper()
	p := &process{base: "http://" + addr, logs: &strings.Builder{}}
	p.cmd = exec.Command(bin, "--listen", addr, "--data-dir", dataDir, "--log-level", "warn")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	waitReady(t, p)
	return p
}

func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

func (p *process) call(t *testing.T, path string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(p.base+path, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestCrashKeepsAcknowledgedWrites runs the real binary on the embedded store,
// completes hundreds of keys and holds some leases from concurrent clients, kills it
// with SIGKILL, restarts it on the same file, and checks that every acknowledged
// completion replays byte for byte and every acknowledged lease is still held.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds, starts and kills the daemon binary")
	}
	t.Parallel()
	bin := buildDaemon(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	addr := testdaemon.FreeAddr(t)
	p := startBinary(t, bin, dataDir, addr)

	const completed, held, clients = 400, 50, 16
	bodies := make(map[string][]byte)
	for i := range completed {
		bodies[fmt.Sprintf("done-%d", i)] = []byte(fmt.Sprintf(`{"order":%d,"bytes":"\u00e9\u0000%d"}`, i, i*i))
	}
	var (
		mu    sync.Mutex
		acked = make(map[string]bool)
		work  = make(chan string)
		wg    sync.WaitGroup
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range work {
				code, claimed := p.call(t, "/v1/claim", map[string]any{"key": key, "owner": "crash-test", "lease_ms": 3_600_000})
				if code != http.StatusCreated {
					t.Errorf("claim %s: %d %v", key, code, claimed)
					continue
				}
				body, done := bodies[key]
				if done {
					code, _ := p.call(t, "/v1/complete", map[string]any{"key": key, "lease_token": claimed["lease_token"],
						"response": map[string]any{"status": 201, "headers": map[string][]string{"Location": {"/orders/" + key}}, "body": body}})
					if code != http.StatusOK {
						t.Errorf("complete %s: %d", key, code)
						continue
					}
				}
				mu.Lock()
				acked[key] = true
				mu.Unlock()
			}
		}()
	}
	for key := range bodies {
		work <- key
	}
	for i := range held {
		work <- fmt.Sprintf("held-%d", i)
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	p.kill(t)

	p = startBinary(t, bin, dataDir, addr)
	for key := range acked {
		code, got := p.call(t, "/v1/claim", map[string]any{"key": key, "owner": "someone-else"})
		body, done := bodies[key]
		if !done {
			if code != http.StatusConflict || got["code"] != "in_progress" {
				t.Errorf("held lease %s after the crash: %d %v, want 409 in_progress", key, code, got)
			}
			continue
		}
		resp, _ := got["response"].(map[string]any)
		if code != http.StatusOK || got["outcome"] != "completed" || resp == nil {
			t.Errorf("completed %s after the crash: %d %v", key, code, got)
			continue
		}
		stored, _ := base64.StdEncoding.DecodeString(fmt.Sprint(resp["body"]))
		if string(stored) != string(body) || fmt.Sprint(resp["headers"]) != fmt.Sprint(map[string]any{"Location": []any{"/orders/" + key}}) {
			t.Errorf("completed %s replays %q %v, want %q", key, stored, resp["headers"], body)
		}
	}
	if len(acked) != completed+held {
		t.Fatalf("%d writes acknowledged, want %d", len(acked), completed+held)
	}
}

// TestSecondDaemonOnSameDataDir starts two binaries on one data directory: the second
// must exit with a clear message, not hang.
func TestSecondDaemonOnSameDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds, starts and kills the daemon binary")
	}
	t.Parallel()
	bin := buildDaemon(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	startBinary(t, bin, dataDir, testdaemon.FreeAddr(t))

	cmd := exec.Command(bin, "--listen", testdaemon.FreeAddr(t), "--data-dir", dataDir)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() {
		out, err = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait.Scale(20 * time.Second)):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("the second daemon neither started nor exited in time")
	}
	if err == nil || !strings.Contains(string(out), "locked by another process") {
		t.Fatalf("second daemon: %v\n%s", err, out)
	}
}

// TestDataDirNotWritable refuses to start where the database cannot be written.
func TestDataDirNotWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m := NewMain()
	if err := m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(file, "data")}); err != nil {
		t.Fatal(err)
	}
	err := m.Open()
	if err == nil || !strings.Contains(err.Error(), "data directory") {
		t.Fatalf("Open with an unusable data dir: %v, want a data directory error", err)
	}
}
