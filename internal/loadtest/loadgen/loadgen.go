// Package loadgen drives claim+complete cycles on fresh keys against an idemd (or
// anything that answers the same two calls) and measures throughput and latency. The
// benchmarks and the idemd-load command share it, so every figure comes from the same
// load generator.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config says how much load to send.
type Config struct {
	BaseURL string
	// BaseURLs, when set, spreads the clients over several servers: client w sends
	// to BaseURLs[w%len(BaseURLs)], and BaseURL is not used.
	BaseURLs []string
	// Clients is the number of concurrent clients, each running cycles back to back.
	Clients int
	// Cycles is the total number of claim+complete cycles; Duration, when set, stops the
	// run earlier.
	Cycles   int
	Duration time.Duration
	// KeyPrefix makes the keys of one run unique.
	KeyPrefix string
	// Header is added to every request (for example Authorization).
	Header http.Header
}

// Result is what a run measured.
type Result struct {
	Cycles   int           `json:"cycles"`
	Errors   int           `json:"errors"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	ClaimP50 time.Duration `json:"claim_p50_ns"`
	ClaimP99 time.Duration `json:"claim_p99_ns"`
	CycleP99 time.Duration `json:"cycle_p99_ns"`
	// CPU is the user and system time the whole process spent during the run: the
	// generator's own when it runs in a process of its own (cmd/idemd-load).
	CPU time.Duration `json:"cpu_ns"`
	// FirstError is the first failed cycle's error, when any failed.
	FirstError string `json:"first_error,omitempty"`
	// CyclesByURL, with Config.BaseURLs, is the cycles sent to each of them.
	CyclesByURL []int `json:"cycles_by_url,omitempty"`
}

// CyclesPerSecond is the throughput of successful cycles.
func (r Result) CyclesPerSecond() float64 { return float64(r.Cycles) / r.Elapsed.Seconds() }

func (r Result) String() string {
	return fmt.Sprintf("%d cycles in %s: %.0f cycles/s, claim p50 %s p99 %s, cycle p99 %s, %d errors",
		r.Cycles, r.Elapsed.Round(time.Millisecond), r.CyclesPerSecond(),
		r.ClaimP50.Round(time.Microsecond), r.ClaimP99.Round(time.Microsecond), r.CycleP99.Round(time.Microsecond), r.Errors)
}

// Run sends the load and waits for it to finish.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Clients <= 0 || cfg.Cycles <= 0 {
		return Result{}, fmt.Errorf("loadgen: clients and cycles must be positive")
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	transport := &http.Transport{MaxIdleConns: cfg.Clients, MaxIdleConnsPerHost: cfg.Clients}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}

	var next, errs atomic.Int64
	var firstErr atomic.Pointer[string]
	claims := make([][]time.Duration, cfg.Clients)
	cycles := make([][]time.Duration, cfg.Clients)
	var wg sync.WaitGroup
	cpuBefore := processCPU()
	start := time.Now()
	for w := range cfg.Clients {
		wg.Add(1)
		c := cfg
		if len(cfg.BaseURLs) > 0 {
			c.BaseURL = cfg.BaseURLs[w%len(cfg.BaseURLs)]
		}
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1)
				if i > int64(cfg.Cycles) {
					return
				}
				claimTook, cycleTook, err := cycle(ctx, client, c, fmt.Sprintf("%s-%d", cfg.KeyPrefix, i))
				if err != nil && ctx.Err() != nil {
					// Cut off by the run's end (Duration) or by the caller: not a failure.
					return
				}
				if err != nil {
					errs.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				claims[w] = append(claims[w], claimTook)
				cycles[w] = append(cycles[w], cycleTook)
			}
		}()
	}
	wg.Wait()
	res := Result{Elapsed: time.Since(start), Errors: int(errs.Load()), CPU: processCPU() - cpuBefore}
	if e := firstErr.Load(); e != nil {
		res.FirstError = *e
	}
	allClaims, allCycles := slices.Concat(claims...), slices.Concat(cycles...)
	res.Cycles = len(allCycles)
	if len(cfg.BaseURLs) > 0 {
		res.CyclesByURL = make([]int, len(cfg.BaseURLs))
		for w := range cycles {
			res.CyclesByURL[w%len(cfg.BaseURLs)] += len(cycles[w])
		}
	}
	res.ClaimP50, res.ClaimP99 = quantile(allClaims, 0.50), quantile(allClaims, 0.99)
	res.CycleP99 = quantile(allCycles, 0.99)
	if res.Cycles == 0 {
		return res, fmt.Errorf("loadgen: no cycle succeeded (%d errors)", res.Errors)
	}
	return res, nil
}

// processCPU is the user and system time this process has spent so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*q))]
}

func cycle(ctx context.Context, client *http.Client, cfg Config, key string) (claimTook, cycleTook time.Duration, err error) {
	start := time.Now()
	var claimed struct {
		LeaseToken string `json:"lease_token"`
	}
	claimBody := fmt.Sprintf(`{"key":%q,"fingerprint":"load","lease_ms":30000}`, key)
	if err := post(ctx, client, cfg, "/v1/claim", claimBody, http.StatusCreated, &claimed); err != nil {
		return 0, 0, err
	}
	claimTook = time.Since(start)
	completeBody := fmt.Sprintf(`{"key":%q,"lease_token":%q,"response":{"status":201,"headers":{"Content-Type":["application/json"]},"body":"eyJvcmRlciI6NDJ9"}}`,
		key, claimed.LeaseToken)
	if err := post(ctx, client, cfg, "/v1/complete", completeBody, http.StatusOK, nil); err != nil {
		return 0, 0, err
	}
	return claimTook, time.Since(start), nil
}

func post(ctx context.Context, client *http.Client, cfg Config, path, body string, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.BaseURL+path, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range cfg.Header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
