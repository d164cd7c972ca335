// Package testdaemon runs the real idemd binary for tests of other programs (idemctl,
// the deploy checks): on a free loopback port, with a data directory of its own, and
// stopped by its PID when the test ends.
package testdaemon

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/wait"
)

// Logs is a buffer a process writes while the test reads it.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Logs) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Logs) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// FreeAddr returns a loopback address nothing listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Env is the environment without IDEMD_ variables, which would configure idemd.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMD_") {
			env = append(env, kv)
		}
	}
	return env
}

// Start runs the idemd binary bin with flags after its own --listen and --data-dir, and
// returns its base URL once probe (a path such as /readyz) answers 200. A daemon that
// exits before then fails the test with its logs. It is stopped with SIGTERM when the
// test ends, and killed if it has not stopped 30 s later.
func Start(t testing.TB, bin, probe string, flags ...string) string {
	t.Helper()
	addr := FreeAddr(t)
	logs := &Logs{}
	cmd := exec.Command(bin, append([]string{"--listen", addr, "--data-dir", t.TempDir()}, flags...)...)
	cmd.Env = Env()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	base := "http://" + addr
	wait.For(t, 30*time.Second, "idemd to answer "+probe, func() bool {
		select {
		case <-exited:
			t.Fatalf("idemd exited:\n%s", logs)
		default:
		}
		resp, err := http.Get(base + probe)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base
}
