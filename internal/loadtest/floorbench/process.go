package floorbench

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/idemd/idemd/internal/loadtest/proc"
)

// stopGrace is how long a child has after SIGTERM before it is killed.
const stopGrace = 10 * time.Second

// readyWithin is how long waitFor waits, unless told otherwise.
const readyWithin = 60 * time.Second

// waitFor polls ok until it holds, the process exits, or readyWithin passes.
func waitFor(ctx context.Context, p *proc.Process, what string, ok func() bool) error {
	return proc.WaitWithin(ctx, readyWithin, p, what, ok)
}

func waitTCP(ctx context.Context, p *proc.Process) error {
	return waitFor(ctx, p, p.Addr, func() bool {
		c, err := net.DialTimeout("tcp", p.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func waitHTTP(ctx context.Context, within time.Duration, p *proc.Process, url string) error {
	client := &http.Client{Timeout: time.Second}
	return proc.WaitWithin(ctx, within, p, url, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// cpuOf reads the CPU time of every pid.
func cpuOf(pids []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		var err error
		if out[i], err = proc.CPU(pid); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loadAverage is the load average over a minute.
func loadAverage() string { return proc.LoadAverage(1) }
