package floorbench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// process is a child the bench started; only these are ever signalled, by PID.
type process struct {
	name string
	cmd  *exec.Cmd
	addr string
	logs syncBuffer
	// done is closed when the process has exited.
	done chan struct{}
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// syncBuffer is a process's output, written by exec's copying goroutines and read
// when the process fails.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// processes are the children of one run, stopped together at its end.
type processes struct{ started []*process }

func (ps *processes) start(name string, argv ...string) (*process, error) {
	p := &process{name: name, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	ps.started = append(ps.started, p)
	return p, nil
}

// stopAll sends SIGTERM to each process it started, by PID, and SIGKILL to one
// still running 10 s later.
func (ps *processes) stopAll() {
	for _, p := range ps.started {
		p.stop()
	}
	ps.started = nil
}

// stop sends SIGTERM to p, by PID, and SIGKILL if it still runs 10 s later, and
// waits until it has exited.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// freePort is a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// readyWithin is how long waitFor waits, unless told otherwise.
const readyWithin = 60 * time.Second

// waitFor polls ok until it holds, the process exits, or readyWithin passes.
func waitFor(ctx context.Context, p *process, what string, ok func() bool) error {
	return waitWithin(ctx, readyWithin, p, what, ok)
}

// waitWithin is waitFor with a deadline of its own.
func waitWithin(ctx context.Context, within time.Duration, p *process, what string, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.name, p.logs.String())
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not ready within %s\n%s", p.name, what, within, p.logs.String())
		case <-tick.C:
		}
	}
	return nil
}

func waitTCP(ctx context.Context, p *process) error {
	return waitFor(ctx, p, p.addr, func() bool {
		c, err := net.DialTimeout("tcp", p.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func waitHTTP(ctx context.Context, within time.Duration, p *process, url string) error {
	client := &http.Client{Timeout: time.Second}
	return waitWithin(ctx, within, p, url, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
