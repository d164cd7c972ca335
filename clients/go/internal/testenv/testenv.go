// Package testenv runs real idemd daemons for the client's tests: it builds the
// daemon from this repository and starts it on a free loopback port with the
// embedded store in a temporary directory.
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
	"sync"
	"syscall"
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
// until it is ready.
func Start(bin, dataDir string, args ...string) (*Daemon, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	d := &Daemon{URL: "http://" + addr, addr: addr, bin: bin,
		args: append([]string{"--listen", addr, "--data-dir", dataDir, "--log-level", "warn"}, args...)}
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
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("idemd exited: %v\n%s", err, d.logs)
		default:
		}
		if resp, err := http.Get(d.URL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				go func() { <-exited }()
				return nil
			}
		}
		if time.Now().After(deadline) {
			d.Kill()
			return errors.New("idemd was not ready within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the daemon with SIGKILL and waits until its port is closed.
func (d *Daemon) Kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", d.addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
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
