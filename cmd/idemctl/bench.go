package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	idem "github.com/idemd/idemd/clients/go"
)

// benchConfig says what load bench sends.
type benchConfig struct {
	mode        string
	concurrency int
	requests    int
	duration    time.Duration
	keys        int
	bodyBytes   int
	lease       time.Duration
}

// benchWorker is one client's measurements; each worker owns its own, so recording
// takes no lock.
type benchWorker struct {
	latency map[string][]time.Duration
	errors  map[string]int
	first   error
}

func (w *benchWorker) fail(kind string, err error) {
	w.errors[kind]++
	if w.first == nil {
		w.first = err
	}
}

// errorKind names an error for the report: idemd's problem code, else "unavailable".
func errorKind(err error) string {
	var p *idem.Problem
	if errors.As(err, &p) {
		if p.Code != "" {
			return p.Code
		}
		return fmt.Sprintf("http_%d", p.Status)
	}
	if errors.Is(err, idem.ErrUnavailable) {
		return "unreachable"
	}
	return "error"
}

// benchResult is what bench prints (as JSON with --json).
type benchResult struct {
	Mode        string `json:"mode"`
	URL         string `json:"url"`
	Concurrency int    `json:"concurrency"`
	// Operations are cycles (claim+complete) or replays; Requests are HTTP calls.
	Operations   int                           `json:"operations"`
	Requests     int                           `json:"requests"`
	Errors       map[string]int                `json:"errors"`
	FirstError   string                        `json:"first_error,omitempty"`
	Elapsed      float64                       `json:"elapsed_seconds"`
	OpsPerSec    float64                       `json:"operations_per_second"`
	ReqPerSec    float64                       `json:"requests_per_second"`
	Latency      map[string]map[string]float64 `json:"latency_seconds"`
	CPUPerReq    float64                       `json:"cpu_seconds_per_request"`
	CPUOfOneCore float64                       `json:"cpu_cores"`
}

var quantiles = []struct {
	name string
	q    float64
}{{"p50", .50}, {"p90", .90}, {"p99", .99}, {"p99.9", .999}, {"max", 1}}

func (a *app) bench(args []string) int {
	fs := a.flags("bench")
	cfg := benchConfig{}
	fs.StringVar(&cfg.mode, "mode", "cycle", "cycle: claim+complete on fresh keys; replay: claims of completed keys")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "concurrent clients")
	fs.IntVar(&cfg.requests, "requests", 10000, "operations (cycles or replays) in all")
	fs.DurationVar(&cfg.duration, "duration", time.Minute, "stop after this long even if operations remain")
	fs.IntVar(&cfg.keys, "keys", 100, "replay: how many completed keys the replays cycle through")
	fs.IntVar(&cfg.bodyBytes, "body-bytes", 64, "size of the stored response body")
	fs.DurationVar(&cfg.lease, "lease", 30*time.Second, "lease of each claim")
	_, err := a.parse(fs, args, 0, "no arguments")
	switch {
	case err != nil:
	case cfg.mode != "cycle" && cfg.mode != "replay":
		err = fmt.Errorf("--mode is cycle or replay, not %q", cfg.mode)
	case cfg.concurrency <= 0 || cfg.requests <= 0 || cfg.keys <= 0 || cfg.duration <= 0:
		err = errors.New("--concurrency, --requests, --keys and --duration must be positive")
	case cfg.bodyBytes < 0 || cfg.lease <= 0:
		err = errors.New("--body-bytes must not be negative and --lease must be positive")
	}
	if err != nil {
		return a.usageError(err)
	}
	// One connection per client, kept alive; errors must show, so nothing is retried.
	transport, err := a.transport()
	if err != nil {
		return a.usageError(err)
	}
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = cfg.concurrency, cfg.concurrency
	defer transport.CloseIdleConnections()
	client, err := a.client(transport, idem.WithRetries(0))
	if err != nil {
		return a.usageError(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration)
	defer cancel()
	prefix := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	body := []byte(strings.Repeat("x", cfg.bodyBytes))
	response := idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
	opts := idem.ClaimOptions{Fingerprint: "bench", Lease: cfg.lease}

	if cfg.mode == "replay" {
		for i := range cfg.keys {
			key := fmt.Sprintf("%s-%d", prefix, i)
			cl, err := client.Claim(ctx, key, opts)
			if err == nil {
				err = client.Complete(ctx, key, cl.Token, response)
			}
			if err != nil {
				fmt.Fprintln(a.stderr, "idemctl: bench: completing the keys to replay:", err)
				return a.fail(err)
			}
		}
	}

	workers := make([]*benchWorker, cfg.concurrency)
	var next atomic.Int64
	var wg sync.WaitGroup
	cpuBefore := cpuTime()
	start := time.Now()
	for w := range workers {
		worker := &benchWorker{latency: map[string][]time.Duration{}, errors: map[string]int{}}
		workers[w] = worker
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1)
				if i > int64(cfg.requests) {
					return
				}
				if cfg.mode == "replay" {
					worker.replay(ctx, client, fmt.Sprintf("%s-%d", prefix, i%int64(cfg.keys)), opts)
				} else {
					worker.cycle(ctx, client, fmt.Sprintf("%s-%d", prefix, i), opts, response)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpuBefore

	res := benchResult{Mode: cfg.mode, URL: a.url, Concurrency: cfg.concurrency, Errors: map[string]int{},
		Elapsed: elapsed.Seconds(), Latency: map[string]map[string]float64{}}
	all := map[string][]time.Duration{}
	for _, w := range workers {
		for name, d := range w.latency {
			all[name] = append(all[name], d...)
		}
		for kind, n := range w.errors {
			res.Errors[kind] += n
		}
		if w.first != nil && res.FirstError == "" {
			res.FirstError = w.first.Error()
		}
	}
	// An operation's latency is recorded once it succeeded: "cycle" or "replay".
	res.Operations = len(all[cfg.mode])
	for name, d := range all {
		slices.Sort(d)
		res.Latency[name] = map[string]float64{}
		for _, q := range quantiles {
			res.Latency[name][q.name] = quantile(d, q.q).Seconds()
		}
		if name != "cycle" {
			res.Requests += len(d)
		}
	}
	errs := 0
	for _, n := range res.Errors {
		errs += n
	}
	res.OpsPerSec = float64(res.Operations) / elapsed.Seconds()
	res.ReqPerSec = float64(res.Requests) / elapsed.Seconds()
	if sent := res.Requests + errs; sent > 0 {
		res.CPUPerReq = cpu.Seconds() / float64(sent)
	}
	res.CPUOfOneCore = cpu.Seconds() / elapsed.Seconds()

	if a.json {
		a.printJSON(res)
	} else {
		a.printBench(res, []string{"claim", "complete", "cycle", "replay"})
	}
	switch {
	case res.Operations == 0 && errs > 0 && res.Errors["unreachable"] == errs:
		return exitUnavailable
	case errs > 0:
		return exitRefused
	}
	return exitOK
}

// cycle claims a fresh key and completes it.
func (w *benchWorker) cycle(ctx context.Context, c *idem.Client, key string, opts idem.ClaimOptions, r idem.Response) {
	start := time.Now()
	cl, err := c.Claim(ctx, key, opts)
	if err != nil {
		w.fail(errorKind(err), err)
		return
	}
	claimed := time.Now()
	w.latency["claim"] = append(w.latency["claim"], claimed.Sub(start))
	if cl.Outcome != idem.Acquired {
		w.fail("unexpected_outcome", fmt.Errorf("claim of fresh key %s: %s", key, cl.Outcome))
		return
	}
	if err := c.Complete(ctx, key, cl.Token, r); err != nil {
		w.fail(errorKind(err), err)
		return
	}
	done := time.Now()
	w.latency["complete"] = append(w.latency["complete"], done.Sub(claimed))
	w.latency["cycle"] = append(w.latency["cycle"], done.Sub(start))
}

// replay claims a completed key, which answers the stored response.
func (w *benchWorker) replay(ctx context.Context, c *idem.Client, key string, opts idem.ClaimOptions) {
	start := time.Now()
	cl, err := c.Claim(ctx, key, opts)
	if err != nil {
		w.fail(errorKind(err), err)
		return
	}
	if cl.Outcome != idem.Completed {
		w.fail("unexpected_outcome", fmt.Errorf("claim of completed key %s: %s", key, cl.Outcome))
		return
	}
	w.latency["replay"] = append(w.latency["replay"], time.Since(start))
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*q))]
}

// cpuTime is the CPU this process has used, user and system, so that bench can show
// it is not the limit of what it measures.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (a *app) printBench(res benchResult, order []string) {
	unit := map[string]string{"cycle": "cycles", "replay": "replays"}[res.Mode]
	errs := 0
	for _, n := range res.Errors {
		errs += n
	}
	fmt.Fprintf(a.stdout, "%s: %d clients, %d %s in %s: %.0f %s/s, %.0f requests/s, %d errors\n",
		res.URL, res.Concurrency, res.Operations, unit, time.Duration(res.Elapsed*float64(time.Second)).Round(time.Millisecond),
		res.OpsPerSec, unit, res.ReqPerSec, errs)
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "latency\t")
	for _, q := range quantiles {
		fmt.Fprintf(tw, "%s\t", q.name)
	}
	fmt.Fprintln(tw)
	for _, name := range order {
		l, ok := res.Latency[name]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t", name)
		for _, q := range quantiles {
			fmt.Fprintf(tw, "%s\t", roundLatency(time.Duration(l[q.name]*float64(time.Second))))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	if errs > 0 {
		kinds := make([]string, 0, len(res.Errors))
		for _, kind := range slices.Sorted(maps.Keys(res.Errors)) {
			kinds = append(kinds, fmt.Sprintf("%d %s", res.Errors[kind], kind))
		}
		fmt.Fprintf(a.stdout, "errors: %s; first: %s\n", strings.Join(kinds, ", "), res.FirstError)
	}
	fmt.Fprintf(a.stdout, "idemctl's own CPU: %s per request, %.2f of a core\n",
		roundLatency(time.Duration(res.CPUPerReq*float64(time.Second))), res.CPUOfOneCore)
}

func roundLatency(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= 100*time.Microsecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
