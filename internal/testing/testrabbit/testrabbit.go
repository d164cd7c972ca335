// Package testrabbit runs a real RabbitMQ broker for tests: a node of its own (its own
// name, data directory, Erlang cookie and epmd) on free loopback ports, stopped by its
// PIDs at the end. Without RabbitMQ installed, New skips the test with a message,
// unless IDEMD_REQUIRE_RABBITMQ is set (as .ci/run does), which turns the skip into a
// failure.
package testrabbit

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemd/idemd/internal/testing/wait"
)

// ErrNotInstalled is Start's error when rabbitmq-server or epmd cannot be found.
var ErrNotInstalled = errors.New("RabbitMQ not installed (apt-get install rabbitmq-server)")

// Broker is a running RabbitMQ node.
type Broker struct {
	// URL connects to the default virtual host as guest.
	URL  string
	dir  string
	epmd *exec.Cmd
	node *exec.Cmd
	done chan struct{}
	logs string
}

// New starts a broker for one test and stops it when the test ends.
func New(t testing.TB) *Broker {
	t.Helper()
	b, err := Start()
	if errors.Is(err, ErrNotInstalled) {
		if os.Getenv("IDEMD_REQUIRE_RABBITMQ") != "" {
			t.Fatalf("RabbitMQ is required (IDEMD_REQUIRE_RABBITMQ is set): %v", err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// serverPath is Debian's rabbitmq-server script that runs the node as the calling
// user (the one in /usr/sbin switches to the rabbitmq user), else the one on the PATH.
func serverPath() (string, error) {
	const debian = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		return p, nil
	}
	return "", ErrNotInstalled
}

// Start runs epmd and a RabbitMQ node and returns once the node accepts AMQP
// connections. Ports found free may be taken before the node binds them: it tries a
// few times.
func Start() (*Broker, error) {
	server, err := serverPath()
	if err != nil {
		return nil, err
	}
	epmd, err := exec.LookPath("epmd")
	if err != nil {
		return nil, ErrNotInstalled
	}
	var last error
	for range 5 {
		b, err := start(server, epmd)
		if err == nil {
			return b, nil
		}
		last = err
	}
	return nil, last
}

func start(server, epmdPath string) (*Broker, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	dir, err := os.MkdirTemp("", "idemd-rabbitmq-")
	if err != nil {
		return nil, err
	}
	b := &Broker{
		URL:  fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort),
		dir:  dir,
		done: make(chan struct{}),
		logs: filepath.Join(dir, "node.log"),
	}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", amqpPort)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// An epmd of the node's own, run in the foreground so that its PID is known: the
	// node would otherwise start one as a daemon and leave it running.
	b.epmd = exec.Command(epmdPath, "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1")
	if err := b.epmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	logFile, err := os.Create(b.logs)
	if err != nil {
		b.stopEpmd()
		os.RemoveAll(dir)
		return nil, err
	}
	defer logFile.Close()
	b.node = exec.Command(server)
	b.node.Env = append(os.Environ(),
		"HOME="+dir, // the Erlang cookie
		"RABBITMQ_NODENAME=idemd-test-"+strconv.Itoa(amqpPort)+"@localhost",
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"ERL_EPMD_PORT="+strconv.Itoa(epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "node.pid"),
	)
	b.node.Stdout, b.node.Stderr = logFile, logFile
	// The script starts the Erlang VM as its child: a group of their own lets Stop
	// signal both.
	b.node.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := b.node.Start(); err != nil {
		b.stopEpmd()
		os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = b.node.Wait(); close(b.done) }()

	deadline := time.Now().Add(wait.Scale(90 * time.Second))
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 250*time.Millisecond) {
		select {
		case <-b.done:
			out, _ := os.ReadFile(b.logs)
			b.stopEpmd()
			os.RemoveAll(dir)
			return nil, fmt.Errorf("rabbitmq-server exited: %s", out)
		default:
		}
		conn, err := amqp.DialConfig(b.URL, amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			conn.Close()
			return b, nil
		}
		if time.Now().After(deadline) {
			b.Stop()
			return nil, fmt.Errorf("RabbitMQ did not accept connections within 90 s: %v", err)
		}
		time.Sleep(pause)
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Stop shuts the node down (SIGTERM to its group, which has the script and the Erlang
// VM; SIGKILL if the group is still there after 30 s), then its epmd, and removes its
// directory.
func (b *Broker) Stop() {
	group := -b.node.Process.Pid
	_ = syscall.Kill(group, syscall.SIGTERM)
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(group, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(group, syscall.SIGKILL)
	<-b.done
	b.stopEpmd()
	os.RemoveAll(b.dir)
}

func (b *Broker) stopEpmd() {
	_ = b.epmd.Process.Kill()
	_ = b.epmd.Wait()
}
