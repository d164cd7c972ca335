// Package blobbench measures idemd with large results: the daemon's memory while it
// takes and replays them (RSS mode) and the replay's throughput and latency, inline
// and by reference (replay mode). It starts real processes on loopback: an idemd
// binary over its embedded store with a blob directory, or over a redis-server with
// its blobs in SeaweedFS's S3 gateway (weed), and drives them over HTTP from this
// process. cmd/idemd-blobbench wires it; docs/bench-blobs.md shows its output.
package blobbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemd/idemd/internal/loadtest/proc"
)

// Config says what to measure.
type Config struct {
	Out io.Writer
	// Daemons are the idemd binaries to compare, each with a label ("before", "after").
	Daemons []Daemon
	// Stores are "dir" (the embedded store and a blob directory) and "s3" (Redis and
	// weed's S3 gateway).
	Stores      []string
	RedisServer string
	Weed        string
	// Clients and Size shape the RSS mode: Clients concurrent raw-PUT completions of
	// Size bytes each, then Clients concurrent raw GETs of them.
	Clients int
	Size    int64
	// Sizes, Replays, ReplayClients and Rounds shape the replay mode: for each size,
	// Keys results completed, then Replays raw GETs by ReplayClients clients, Rounds
	// times; inline where the size allows and by reference.
	Sizes         []int64
	Replays       int
	ReplayClients int
	Keys          int
	Rounds        int
}

// Daemon is an idemd binary and its label.
type Daemon struct{ Label, Path string }

// setup is a running daemon and the servers behind it.
type setup struct {
	procs  proc.Group
	daemon *proc.Process
	url    string
	redis  string
	others []*proc.Process // redis-server, weed
	dir    string
}

// maxInline is the --max-response-bytes of the daemons: the largest result that can
// stay in its record, 1 MiB and room for its headers.
const maxInline = 1<<20 + 4<<10

// start runs daemon d over store with results over threshold kept by reference.
func start(ctx context.Context, cfg Config, d Daemon, store string, threshold int) (*setup, error) {
	dir, err := os.MkdirTemp("", "idemd-blobbench-*")
	if err != nil {
		return nil, err
	}
	s := &setup{dir: dir}
	fail := func(err error) (*setup, error) {
		s.stop()
		return nil, err
	}
	port, err := proc.FreePort()
	if err != nil {
		return fail(err)
	}
	args := []string{d.Path, "--listen", "127.0.0.1:" + strconv.Itoa(port), "--log-level", "warn",
		"--max-response-bytes", strconv.Itoa(maxInline), "--blob-threshold", strconv.Itoa(threshold),
		"--store-timeout", "30s", "--body-timeout", "5m", "--write-timeout", "5m"}
	switch store {
	case "dir":
		args = append(args, "--data-dir", filepath.Join(dir, "data"), "--blob-store", "file://"+filepath.Join(dir, "blobs"))
	case "s3":
		addr, redis, err := startRedis(ctx, &s.procs, cfg.RedisServer, dir)
		if err != nil {
			return fail(err)
		}
		endpoint, weed, err := startWeed(ctx, &s.procs, cfg.Weed, dir)
		if err != nil {
			return fail(err)
		}
		s.redis, s.others = addr, []*proc.Process{redis, weed}
		args = append(args, "--store", "redis://"+addr, "--blob-store",
			"s3://idemd/bench?endpoint="+endpoint+"&region=us-east-1&path_style=true&anonymous=true")
	default:
		return fail(fmt.Errorf("unknown store %q (dir, s3)", store))
	}
	if s.daemon, err = s.procs.Start("idemd "+d.Label, dir, args...); err != nil {
		return fail(err)
	}
	s.url = "http://127.0.0.1:" + strconv.Itoa(port)
	if err := proc.WaitWithin(ctx, readyWithin, s.daemon, s.url+"/readyz", func() bool { return httpOK(s.url + "/readyz") }); err != nil {
		return fail(err)
	}
	return s, nil
}

// stop ends the setup's processes and removes its directory.
func (s *setup) stop() {
	s.procs.Stop(stopGrace)
	_ = os.RemoveAll(s.dir)
}

// client is the HTTP client of every request: enough idle connections for every
// concurrent one.
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}

// complete claims key and completes it with body through a raw PUT.
func (s *setup) complete(key string, body []byte) error {
	resp, err := client.Post(s.url+"/v1/claim", "application/json", strings.NewReader(`{"key":"`+key+`"}`))
	if err != nil {
		return err
	}
	var claimed struct {
		LeaseToken string `json:"lease_token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&claimed)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("claim %s: %s %v", key, resp.Status, err)
	}
	req, err := http.NewRequest(http.MethodPut, s.url+"/v1/keys/"+key+"/result", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Idemd-Lease-Token", claimed.LeaseToken)
	req.Header.Set("Idemd-Status", "200")
	resp, err = client.Do(req)
	if err != nil {
		return err
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PUT %s: %s %s", key, resp.Status, answer)
	}
	return nil
}

// replay reads key's result through a raw GET and checks its length.
func (s *setup) replay(key string, size int64) error {
	resp, err := client.Get(s.url + "/v1/keys/" + key + "/result")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("GET %s: %s after %d bytes: %w", key, resp.Status, n, err)
	case resp.StatusCode != http.StatusOK || n != size:
		return fmt.Errorf("GET %s: %s, %d bytes, want %d", key, resp.Status, n, size)
	}
	return nil
}

// together runs fn(i) for i below n on n goroutines and answers the first error.
func together(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// cpus reads the CPU time of the daemon, the servers behind it and this process.
func (s *setup) cpus() []time.Duration {
	out := []time.Duration{cpuTime(s.daemon.PID())}
	for _, p := range s.others {
		out = append(out, cpuTime(p.PID()))
	}
	return append(out, cpuTime(0))
}

func (s *setup) cpuNames() []string {
	out := []string{"daemon"}
	for _, p := range s.others {
		out = append(out, p.Name)
	}
	return append(out, "generator")
}

// perRequest formats the CPU each process spent between a and b per request.
func (s *setup) perRequest(a, b []time.Duration, requests int) string {
	var parts []string
	for i, name := range s.cpuNames() {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", name, float64(b[i]-a[i])/float64(time.Millisecond)/float64(requests)))
	}
	return strings.Join(parts, ", ")
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

// Run measures what cfg says: RSS when mode is "rss", replays when "replay".
func Run(ctx context.Context, cfg Config, mode string) error {
	fmt.Fprintf(cfg.Out, "%d cores, load average %s at the start\n", runtime.NumCPU(), loadAverage())
	switch mode {
	case "rss":
		return runRSS(ctx, cfg)
	case "replay":
		return runReplay(ctx, cfg)
	}
	return fmt.Errorf("unknown mode %q (rss, replay)", mode)
}

// runRSS completes cfg.Clients results of cfg.Size bytes at once through raw PUTs,
// then replays them all at once through raw GETs, for each store and daemon, and
// prints the daemon's RSS when idle and its peak (VmHWM) after each phase, with each
// process's CPU per request.
func runRSS(ctx context.Context, cfg Config) error {
	body := make([]byte, cfg.Size)
	_, _ = rand.Read(body)
	fmt.Fprintf(cfg.Out, "%d concurrent raw-PUT completions of %s, then %d concurrent raw GETs of them\n\n", cfg.Clients, mib(cfg.Size), cfg.Clients)
	fmt.Fprintln(cfg.Out, "| store | daemon | idle RSS | peak RSS after the PUTs (growth) | peak RSS after the GETs (growth) | PUT phase | CPU per PUT | GET phase | CPU per GET | load |")
	fmt.Fprintln(cfg.Out, "|---|---|---|---|---|---|---|---|---|---|")
	for _, store := range cfg.Stores {
		for _, d := range cfg.Daemons {
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := start(ctx, cfg, d, store, 64<<10)
			if err != nil {
				return err
			}
			err = rssRound(cfg, s, store, d, body)
			s.stop()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func rssRound(cfg Config, s *setup, store string, d Daemon, body []byte) error {
	time.Sleep(time.Second) // the daemon settles after readiness
	idle, _, err := proc.Memory(s.daemon.PID())
	if err != nil {
		return err
	}
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	key := func(i int) string { return "rss-" + run + "-" + strconv.Itoa(i) }
	c0, t0 := s.cpus(), time.Now()
	if err := together(cfg.Clients, func(i int) error { return s.complete(key(i), body) }); err != nil {
		return err
	}
	c1, t1 := s.cpus(), time.Now()
	_, putPeak, err := proc.Memory(s.daemon.PID())
	if err != nil {
		return err
	}
	if err := together(cfg.Clients, func(i int) error { return s.replay(key(i), int64(len(body))) }); err != nil {
		return err
	}
	c2, t2 := s.cpus(), time.Now()
	_, getPeak, err := proc.Memory(s.daemon.PID())
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "| %s | %s | %s | %s (+%s) | %s (+%s) | %.1f s | %s | %.1f s | %s | %s |\n", store, d.Label,
		mib(idle), mib(putPeak), mib(putPeak-idle), mib(getPeak), mib(getPeak-idle),
		t1.Sub(t0).Seconds(), s.perRequest(c0, c1, cfg.Clients), t2.Sub(t1).Seconds(), s.perRequest(c1, c2, cfg.Clients), loadAverage())
	return nil
}

// runReplay measures, for each store and size, completions and replays inline (where
// the size fits in a record) and by reference, over cfg.Rounds rounds.
func runReplay(ctx context.Context, cfg Config) error {
	d := cfg.Daemons[len(cfg.Daemons)-1]
	fmt.Fprintf(cfg.Out, "daemon %s; per round: %d results completed one at a time, then %d raw GETs of them by %d clients\n\n",
		d.Label, cfg.Keys, cfg.Replays, cfg.ReplayClients)
	fmt.Fprintln(cfg.Out, "| store | size | kept | round | complete p50 | replays/s | MB/s | replay p50 | replay p99 | CPU per replay | Redis bytes per record | load |")
	fmt.Fprintln(cfg.Out, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, store := range cfg.Stores {
		for _, inline := range []bool{true, false} {
			// One daemon for every size: inline, the threshold is above every size that
			// fits; by reference, it is below the smallest.
			threshold := maxInline
			if !inline {
				threshold = int(slices.Min(cfg.Sizes)) / 2
			}
			s, err := start(ctx, cfg, d, store, threshold)
			if err != nil {
				return err
			}
			for _, size := range cfg.Sizes {
				if inline && size+1024 > maxInline {
					continue
				}
				for round := range cfg.Rounds {
					if err := ctx.Err(); err != nil {
						s.stop()
						return err
					}
					if err := replayRound(cfg, s, store, size, inline, round); err != nil {
						s.stop()
						return err
					}
				}
			}
			s.stop()
		}
	}
	return nil
}

func replayRound(cfg Config, s *setup, store string, size int64, inline bool, round int) error {
	body := make([]byte, size)
	_, _ = rand.Read(body)
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	key := func(i int) string { return "replay-" + run + "-" + strconv.Itoa(i%cfg.Keys) }
	var before int64
	if s.redis != "" {
		before, _ = redisMemory(s.redis)
	}
	completes := make([]time.Duration, cfg.Keys)
	for i := range cfg.Keys {
		t := time.Now()
		if err := s.complete(key(i), body); err != nil {
			return err
		}
		completes[i] = time.Since(t)
	}
	perRecord := "–"
	if s.redis != "" {
		after, _ := redisMemory(s.redis)
		perRecord = strconv.FormatInt((after-before)/int64(cfg.Keys), 10)
	}
	latencies := make([]time.Duration, cfg.Replays)
	var next int
	var mu sync.Mutex
	c0, t0 := s.cpus(), time.Now()
	err := together(cfg.ReplayClients, func(int) error {
		for {
			mu.Lock()
			i := next
			next++
			mu.Unlock()
			if i >= cfg.Replays {
				return nil
			}
			t := time.Now()
			if err := s.replay(key(i), size); err != nil {
				return err
			}
			latencies[i] = time.Since(t)
		}
	})
	if err != nil {
		return err
	}
	elapsed := time.Since(t0)
	c1 := s.cpus()
	kept := "by reference"
	if inline {
		kept = "inline"
	}
	slices.Sort(latencies)
	slices.Sort(completes)
	rate := float64(cfg.Replays) / elapsed.Seconds()
	fmt.Fprintf(cfg.Out, "| %s | %s | %s | %d | %s | %.0f | %.0f | %s | %s | %s | %s | %s |\n", store, sizeName(size), kept, round+1,
		ms(completes[len(completes)/2]), rate, rate*float64(size)/1e6, ms(latencies[len(latencies)/2]),
		ms(latencies[len(latencies)*99/100]), s.perRequest(c0, c1, cfg.Replays), perRecord, loadAverage())
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func sizeName(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
