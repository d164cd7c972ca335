// Package testpg runs a real PostgreSQL server for tests and benchmarks: initdb into a
// directory of its own, postgres on a free loopback port, stopped by its PID at the end.
// Without PostgreSQL installed, New skips the test with a message, unless
// IDEMD_REQUIRE_POSTGRES is set (as .ci/run does), which turns the skip into a failure.
package testpg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/wait"
)

// ErrNotInstalled is Start's error when initdb or postgres cannot be found.
var ErrNotInstalled = errors.New("PostgreSQL not installed (apt-get install postgresql)")

// Server is a running PostgreSQL.
type Server struct {
	// URL connects to the database postgres as the superuser postgres.
	URL  string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	logs string
}

// New starts a server for one test and stops it when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if errors.Is(err, ErrNotInstalled) {
		if os.Getenv("IDEMD_REQUIRE_POSTGRES") != "" {
			t.Fatalf("PostgreSQL is required (IDEMD_REQUIRE_POSTGRES is set): %v", err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// binDir is where initdb and postgres are: the PATH, else the newest of Debian's
// /usr/lib/postgresql/*/bin, which its package does not put on the PATH.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNotInstalled
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Start runs initdb and postgres and returns once the server accepts connections.
// initdb refuses to run as root, so a root process runs both as the postgres user,
// which Debian's package creates.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemd-pg-")
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, PostgreSQL needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	// A port found free may be taken before postgres binds it: try a few.
	for range 5 {
		s, err := start(bin, dir, data, cred)
		if err == nil {
			return s, nil
		}
		if !strings.Contains(err.Error(), "could not bind") && !strings.Contains(err.Error(), "could not create any TCP/IP sockets") {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	os.RemoveAll(dir)
	return nil, errors.New("postgres found no free port")
}

func start(bin, dir, data string, cred *syscall.Credential) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-h", "127.0.0.1", "-k", dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{
		URL:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		dir:  dir,
		cmd:  cmd,
		done: make(chan struct{}),
		logs: logPath,
	}
	go func() { _ = cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(wait.Scale(30 * time.Second))
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		select {
		case <-s.done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("postgres exited: %s", out)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			conn.Close(ctx)
			cancel()
			return s, nil
		}
		cancel()
		if time.Now().After(deadline) {
			s.kill()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("postgres did not accept connections within 30 s: %v: %s", err, out)
		}
		time.Sleep(pause)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Stop shuts the server down (a fast shutdown, SIGINT; SIGKILL if it has not stopped
// within 30 s) and removes its directory.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.kill()
	}
	os.RemoveAll(s.dir)
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}
