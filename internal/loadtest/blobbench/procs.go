package blobbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one server the benchmark started.
type process struct {
	name string
	cmd  *exec.Cmd
	logs syncBuffer
	done chan struct{}
}

func (p *process) pid() int { return p.cmd.Process.Pid }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// procs are the processes of one setup; stop ends them, by their pids, last first.
type procs struct{ started []*process }

func (ps *procs) start(name, dir string, argv ...string) (*process, error) {
	p := &process{name: name, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	ps.started = append(ps.started, p)
	return p, nil
}

func (ps *procs) stop() {
	for i := len(ps.started) - 1; i >= 0; i-- {
		p := ps.started[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	ps.started = nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitUntil polls ok every 20 ms for up to a minute, or until p exits.
func waitUntil(ctx context.Context, p *process, what string, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.name, p.logs.String())
		case <-ctx.Done():
			return fmt.Errorf("%s: %s did not happen within a minute: %s", p.name, what, p.logs.String())
		case <-tick.C:
		}
	}
	return nil
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startRedis starts a redis-server on a free loopback port, persistence off.
func startRedis(ctx context.Context, ps *procs, bin, dir string) (string, *process, error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	p, err := ps.start("redis-server", dir, bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no")
	if err != nil {
		return "", nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	err = waitUntil(ctx, p, "accepting connections", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr, p, err
}

// redisMemory is used_memory from INFO memory.
func redisMemory(addr string) (int64, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("INFO answered %q: %v", head, err)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
}

// startWeed starts SeaweedFS's weed with an S3 gateway on free loopback ports and
// makes the bucket idemd; it answers the S3 endpoint.
func startWeed(ctx context.Context, ps *procs, bin, dir string) (string, *process, error) {
	ports := make([]string, 8)
	for i := range ports {
		port, err := freePort()
		if err != nil {
			return "", nil, err
		}
		ports[i] = strconv.Itoa(port)
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return "", nil, err
	}
	p, err := ps.start("weed", dir, bin, "server",
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir="+data,
		"-master.port="+ports[1], "-master.port.grpc="+ports[2], "-master.telemetry=false",
		"-master.volumeSizeLimitMB=1024",
		"-volume.port="+ports[3], "-volume.port.grpc="+ports[4], "-volume.max=8",
		"-filer", "-filer.port="+ports[5], "-filer.port.grpc="+ports[6],
		"-filer.localSocket="+filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port="+ports[0], "-s3.port.grpc="+ports[7],
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.localSocket="+filepath.Join(dir, "s3.sock"))
	if err != nil {
		return "", nil, err
	}
	endpoint := "http://127.0.0.1:" + ports[0]
	err = waitUntil(ctx, p, "the S3 gateway making the bucket", func() bool {
		req, _ := http.NewRequest(http.MethodPut, endpoint+"/idemd", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
			return false
		}
		// A first object written and read back: the volume is ready.
		put, _ := http.NewRequest(http.MethodPut, endpoint+"/idemd/warm", strings.NewReader("warm"))
		if resp, err = http.DefaultClient.Do(put); err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && httpOK(endpoint+"/idemd/warm")
	})
	return endpoint, p, err
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's CPU times.
const clockTick = 10 * time.Millisecond

// cpuTime is the user and system time process pid (0: this process) has spent.
func cpuTime(pid int) time.Duration {
	path := "/proc/self/stat"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/stat"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0
	}
	f := bytes.Fields(b[end+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(string(f[11]), 10, 64)
	s, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return time.Duration(u+s) * clockTick
}

// memory is a process's VmRSS and VmHWM (its peak RSS), in bytes.
func memory(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch name {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, errors.New("no VmRSS or VmHWM in /proc status")
	}
	return rss, hwm, nil
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
