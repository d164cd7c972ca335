// Package testredis starts real redis-server processes on free loopback ports for tests.
//
// When redis-server is not installed the tests that need it are skipped, unless
// IDEMD_REQUIRE_REDIS is set (as .ci/run does), which turns the skip into a failure.
package testredis

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/wait"
)

// Server is one redis-server process started by a test.
type Server struct {
	t    testing.TB
	Port int
	Dir  string
	args []string
	cmd  *exec.Cmd
}

// Binary returns the path of redis-server, or skips (or fails) the test without it.
func Binary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("IDEMD_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-server is required (IDEMD_REQUIRE_REDIS is set) but not found: %v", err)
		}
		t.Skip("redis-server not found; install it (apt-get install -y redis-server) to run this test")
	}
	return path
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs a redis-server on a free loopback port with the extra config arguments
// (such as "--appendonly", "yes") and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{t: t, Port: FreePort(t), Dir: t.TempDir(), args: extra}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Restart starts the server again on the same port and directory after Stop or Kill.
func (s *Server) Restart() {
	s.t.Helper()
	bin := Binary(s.t)
	args := append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(s.Dir, "redis.log"),
	}, s.args...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	if err := WaitReady(s.Addr(), 10*time.Second); err != nil {
		s.Stop()
		log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
		s.t.Fatalf("redis-server on %s: %v\n%s", s.Addr(), err, log)
	}
}

// Stop kills the server (SIGKILL: the tests want an abrupt loss) and reaps it.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = s.cmd.Process.Wait()
	s.cmd = nil
}

// Command sends one inline command and returns the first line of the answer.
func (s *Server) Command(args ...string) (string, error) {
	return Command(s.Addr(), args...)
}

// Command sends one command in RESP to addr and returns the first line of the answer;
// it keeps test code free of a second Redis client.
func Command(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// WaitReady waits until a server at addr answers PING, or the timeout passes.
func WaitReady(addr string, timeout time.Duration) error {
	return wait.Until(timeout, func() error {
		reply, err := Command(addr, "PING")
		if err == nil && reply != "+PONG" {
			err = fmt.Errorf("PING answered %q", reply)
		}
		return err
	})
}

// Pause stops the server's process (SIGSTOP) without closing its connections, as a
// hung machine would; Resume lets it go on.
func (s *Server) Pause() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}
