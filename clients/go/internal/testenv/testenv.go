// Package testenv runs real idemd daemons for the client's tests: it builds the
// daemon from this repository and starts it on a free loopback port with the
// embedded store in a temporary directory.
//
// Every deadline a test gives for a condition is multiplied by the slowdown factor
// IDEMD_TEST_SLOWDOWN (3 unless set), as the daemon's internal/testing/wait does.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// Build compiles the daemon once per test process into dir and returns its path.
func Build(dir string) (string, error) {
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
		binary = filepath.Join(dir, "idemd")
		cmd := exec.Command("go", "build", "-o", binary, "./cmd/idemd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building idemd: %v\n%s", err, out)
		}
	})
	return binary, buildErr
}

// Daemon is a running idemd.
type Daemon struct {
	URL  string
	addr string
	cmd  *exec.Cmd
	logs *bytes.Buffer
	bin  string
	args []string
}

// Start runs the daemon binary with args after --listen and --data-dir, and waits
// until it is ready. It runs without a blob store unless args name one (a later
// --blob-store wins), so that a result over --max-response-bytes is refused as the
// tests of that expect.
func Start(bin, dataDir string, args ...string) (*Daemon, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	d := &Daemon{URL: "http://" + addr, addr: addr, bin: bin,
		args: append([]string{"--listen", addr, "--data-dir", dataDir, "--log-level", "warn", "--blob-store", "none"}, args...)}
	return d, d.start()
}

func (d *Daemon) start() error {
	d.logs = &bytes.Buffer{}
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	var gone error
	err := Until(20*time.Second, func() error {
		select {
		case err := <-exited:
			gone = fmt.Errorf("idemd exited: %v\n%s", err, d.logs)
			return nil
		default:
		}
		resp, err := http.Get(d.URL + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		return nil
	})
	switch {
	case gone != nil:
		return gone
	case err != nil:
		d.Kill()
		return fmt.Errorf("idemd was not ready: %w", err)
	}
	go func() { <-exited }()
	return nil
}

// Kill stops the daemon with SIGKILL and waits until its port is closed.
func (d *Daemon) Kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	_ = Until(10*time.Second, func() error {
		c, err := net.DialTimeout("tcp", d.addr, 100*time.Millisecond)
		if err != nil {
			return nil
		}
		c.Close()
		return errors.New("the port still accepts connections")
	})
}

// DefaultSlowdown is the factor deadlines are multiplied by when IDEMD_TEST_SLOWDOWN
// is not set.
const DefaultSlowdown = 3

var slowdown = parseSlowdown(os.Getenv("IDEMD_TEST_SLOWDOWN"))

// parseSlowdown reads the factor; a value that is not a positive number is a mistake
// the tests should not hide, so it panics.
func parseSlowdown(v string) float64 {
	if v == "" {
		return DefaultSlowdown
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) {
		panic(fmt.Sprintf("IDEMD_TEST_SLOWDOWN=%q: want a positive number", v))
	}
	return f
}

// Scale is d multiplied by the slowdown factor: the deadline for a condition, or for
// work, that a test would give d on an ordinary machine. Lease lengths, timeouts under
// test and other durations a test depends on are never scaled.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * slowdown)
}

// Until calls check until it returns nil, pausing a little longer each time (up to
// 50 ms), and returns check's last error once Scale(timeout) has passed. It is the
// daemon's internal/testing/wait, which this module cannot import.
func Until(timeout time.Duration, check func() error) error {
	timeout = Scale(timeout)
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		time.Sleep(pause)
	}
}

// WaitFor fails the test unless cond holds within Scale(timeout); what names the condition.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Until(timeout, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("waiting for %s", what)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Restart starts the daemon again on the same address and data.
func (d *Daemon) Restart() error { return d.start() }

// TempDir makes a directory for a test process, removed by the returned function.
func TempDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", "idem-client-test-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}
