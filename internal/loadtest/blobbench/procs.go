package blobbench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/loadtest/proc"
)

// stopGrace is how long a server has after SIGTERM before it is killed.
const stopGrace = 20 * time.Second

// readyWithin is how long a server has to become ready.
const readyWithin = time.Minute

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startRedis starts a redis-server on a free loopback port, persistence off.
func startRedis(ctx context.Context, ps *proc.Group, bin, dir string) (string, *proc.Process, error) {
	port, err := proc.FreePort()
	if err != nil {
		return "", nil, err
	}
	p, err := ps.Start("redis-server", dir, bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no")
	if err != nil {
		return "", nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	err = proc.WaitWithin(ctx, readyWithin, p, addr, func() bool {
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
func startWeed(ctx context.Context, ps *proc.Group, bin, dir string) (string, *proc.Process, error) {
	ports := make([]string, 8)
	for i := range ports {
		port, err := proc.FreePort()
		if err != nil {
			return "", nil, err
		}
		ports[i] = strconv.Itoa(port)
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return "", nil, err
	}
	p, err := ps.Start("weed", dir, bin, "server",
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
	err = proc.WaitWithin(ctx, readyWithin, p, "the S3 gateway and its bucket", func() bool {
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

// cpuTime is the user and system time process pid (0: this process) has spent, 0
// where it cannot be read.
func cpuTime(pid int) time.Duration {
	if pid == 0 {
		pid = os.Getpid()
	}
	d, _ := proc.CPU(pid)
	return d
}

// loadAverage is the load averages over 1, 5 and 15 minutes.
func loadAverage() string { return proc.LoadAverage(3) }
