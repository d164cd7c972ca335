// Package proc holds the benchmark tools' child processes and their readings from
// /proc: starting a server with its output captured, waiting until it is ready while
// noticing it exit, stopping it by its PID, and the CPU time, memory and load average
// the tools print. Only the tools under internal/loadtest use it; the shipped
// commands do not.
package proc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Process is a child a tool started; only these are ever signalled, by PID.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	// Addr is the loopback address the process serves, for a starter that sets it.
	Addr string
	// Logs is the process's standard output and error.
	Logs Output
	done chan struct{}
}

// PID is the process's id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends sig to p, by PID, and SIGKILL if it still runs grace later, and waits
// until it has exited. A process that has already exited is left alone.
func (p *Process) Stop(sig os.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// Output is a process's output, written by exec's copying goroutines and read when
// the process fails. It keeps the first MiB or so; a child that writes more keeps
// running, and what it writes after is dropped.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.b.Len() > 1<<20 {
		return len(p), nil
	}
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Group is the children of one run or setup, stopped together at its end.
type Group struct{ started []*Process }

// Start starts argv in dir ("": this process's directory) as a child called name.
func (g *Group) Start(name, dir string, argv ...string) (*Process, error) {
	p := &Process{Name: name, Cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	p.Cmd.Dir = dir
	p.Cmd.Stdout, p.Cmd.Stderr = &p.Logs, &p.Logs
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { _ = p.Cmd.Wait(); close(p.done) }()
	g.started = append(g.started, p)
	return p, nil
}

// Stop sends SIGTERM to each process the group started, last first, so that a
// server stops before the ones it uses, and SIGKILL to one still running grace later.
func (g *Group) Stop(grace time.Duration) {
	for i := len(g.started) - 1; i >= 0; i-- {
		g.started[i].Stop(syscall.SIGTERM, grace)
	}
	g.started = nil
}

// FreePort is a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr is FreePort's loopback address, host and port.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// WaitWithin polls ok every 20 ms until it holds, p exits, or within passes; what
// names the awaited condition in the error.
func WaitWithin(ctx context.Context, within time.Duration, p *Process, what string, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.Name, p.Logs.String())
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not ready within %s\n%s", p.Name, what, within, p.Logs.String())
		case <-tick.C:
		}
	}
	return nil
}
