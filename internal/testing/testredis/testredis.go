// Package testredis starts real redis-server processes on free loopback ports for tests.
//
// When redis-server is not installed the tests that need it are skipped, unless
// IDEMD_REQUIRE_REDIS is set (as .ci/run does), which turns the skip into a failure.
package testredis

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/wait"
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

// errPortTaken is a server that could not listen: its port, free when it was picked,
// was taken before the server bound it (by another test's server or an outgoing
// connection's ephemeral port).
var errPortTaken = errors.New("port taken")

// portAttempts bounds how many fresh ports Start tries.
const portAttempts = 5

// Start runs a redis-server on a free loopback port with the extra config arguments
// (such as "--appendonly", "yes") and stops it when the test ends. A port taken between
// being picked and being bound is replaced by another.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	var err error
	for range portAttempts {
		var s *Server
		if s, err = tryStart(t, extra...); err == nil {
			return s
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	t.Fatal(err)
	return nil
}

// tryStart runs a redis-server on a port free a moment ago; errPortTaken says that the
// port was taken meanwhile and another may be tried.
func tryStart(t testing.TB, extra ...string) (*Server, error) {
	t.Helper()
	s := &Server{t: t, Port: FreePort(t), Dir: t.TempDir(), args: extra}
	if err := s.launch(); err != nil {
		return nil, err
	}
	t.Cleanup(s.Stop)
	return s, nil
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Restart starts the server again on the same port and directory after Stop or Kill.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatal(err)
	}
}

// launch starts redis-server and waits until the server that answers on its port is
// this process, not another that holds the port; if the process exits first (its port
// taken, most often) it says why, with the server's log.
func (s *Server) launch() error {
	s.t.Helper()
	bin := Binary(s.t)
	args := append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(s.Dir, "redis.log"),
	}, s.args...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.cmd = cmd
	pid := cmd.Process.Pid
	exited := false
	err := wait.Until(10*time.Second, func() error {
		if isZombie(pid) {
			exited = true
			return nil
		}
		got, err := serverPID(s.Addr())
		if err == nil && got != pid {
			err = fmt.Errorf("the server answering is process %d, not %d", got, pid)
		}
		return err
	})
	if err == nil && !exited {
		return nil
	}
	s.Stop()
	log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if exited {
		err = errors.New("redis-server exited")
		if strings.Contains(string(log), "Address already in use") {
			err = errPortTaken
		}
	}
	return fmt.Errorf("redis-server on %s: %w\n%s", s.Addr(), err, log)
}

// isZombie says whether process pid has exited and awaits its parent's wait, from
// /proc (false where there is none).
func isZombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// serverPID asks the server at addr for its process ID (INFO server).
func serverPID(addr string) (int, error) {
	conn, r, err := send(addr, "INFO", "server")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimRight(head, "\r\n"), "$"))
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("INFO answered %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server names no process_id")
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
	conn, r, err := send(addr, args...)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	line, err := r.ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// send opens a connection to addr and sends one command in RESP on it; the caller reads
// the answer from r and closes conn.
func send(addr string, args ...string) (conn net.Conn, r *bufio.Reader, err error) {
	conn, err = net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(wait.Scale(5 * time.Second)))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, bufio.NewReader(conn), nil
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
