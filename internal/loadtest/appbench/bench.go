package appbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config says what to run and how much.
type Config struct {
	// Clients is the number of concurrent clients of the load generator.
	Clients int
	// Requests is the number of requests of each phase (first requests, replays) of
	// each configuration; MaxPhase stops a phase earlier.
	Requests int
	MaxPhase time.Duration
	// Rounds repeats every configuration, in the same order, so that the spread shows.
	Rounds int
	// Configs selects configurations by name (a, b, c, d, c1, c0); empty means all.
	Configs []string
	// AppCommand starts one app process: the command and its leading arguments, to
	// which the bench appends -mode, -listen, -redis and -idemd.
	AppCommand []string
	// AppFlags are passed to every app process (see cmd/idemd-appbench app -h), with
	// {config} in each replaced by the configuration's name (a, b, c, ...), so that
	// the apps of several configurations can write profiles of their own.
	AppFlags []string
	// Idemd is the idemd binary; empty builds ./cmd/idemd from the module in the
	// working directory.
	Idemd string
	// RedisServer is the redis-server binary.
	RedisServer string
	// ServerCPUs, when set, runs redis-server and the idemd daemons on these CPUs
	// (a taskset list, "1" or "2-3"), apart from the apps and the load generator, which
	// stay on the CPUs the bench itself was given (taskset -c 0 idemd-appbench ...): the
	// service's host and the shared services' hosts, on one machine.
	ServerCPUs string
	Out        io.Writer
}

// configuration is one row of the table.
type configuration struct {
	name, title, mode string
	idemd             *process // nil when the app does not use idemd
	usesRedis         bool
	appFlags          []string
	app               *process
}

// process is a child started by the bench; only these are ever signalled, by PID.
type process struct {
	name string
	cmd  *exec.Cmd
	addr string
	logs bytes.Buffer
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// Run starts redis-server, two idemd daemons (Redis store and embedded store) and one
// app process per configuration on loopback, runs every configuration Rounds times,
// prints the tables to cfg.Out, and stops everything it started.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Clients <= 0 || cfg.Requests <= 0 || cfg.Rounds <= 0 {
		return errors.New("clients, requests and rounds must be positive")
	}
	dir, err := os.MkdirTemp("", "idemd-appbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var started []*process
	// Stopped with SIGINT, so that an app writes its profile; SIGKILL after 5 s.
	defer func() {
		for _, p := range started {
			_ = p.cmd.Process.Signal(syscall.SIGINT)
			exited := make(chan struct{})
			go func() { _, _ = p.cmd.Process.Wait(); close(exited) }()
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				<-exited
			}
		}
	}()
	start := func(name string, argv ...string) (*process, error) {
		p := &process{name: name, cmd: exec.Command(argv[0], argv[1:]...)}
		p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
		if err := p.cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		started = append(started, p)
		return p, nil
	}

	// server starts a shared service: on ServerCPUs when the bench is told to keep
	// them apart.
	server := func(name string, argv ...string) (*process, error) {
		if cfg.ServerCPUs != "" {
			argv = append([]string{"taskset", "-c", cfg.ServerCPUs}, argv...)
		}
		return start(name, argv...)
	}

	if cfg.Idemd == "" {
		cfg.Idemd = filepath.Join(dir, "idemd")
		fmt.Fprintln(cfg.Out, "building idemd ...")
		if out, err := exec.Command("go", "build", "-o", cfg.Idemd, "./cmd/idemd").CombinedOutput(); err != nil {
			return fmt.Errorf("building idemd (run from the repository's root, or give -idemd): %v\n%s", err, out)
		}
	}

	redisAddr, err := freeAddr()
	if err != nil {
		return err
	}
	_, redisPort, _ := net.SplitHostPort(redisAddr)
	redisProc, err := server("redis-server", cfg.RedisServer, "--port", redisPort, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no")
	if err != nil {
		return err
	}
	redisProc.addr = redisAddr
	if err := waitTCP(ctx, redisAddr, &redisProc.logs); err != nil {
		return err
	}
	redisURL := "redis://" + redisAddr + "/0"

	startIdemd := func(name string, args ...string) (*process, error) {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		p, err := server(name, append([]string{cfg.Idemd, "--listen", addr, "--log-level", "warn"}, args...)...)
		if err != nil {
			return nil, err
		}
		p.addr = addr
		return p, waitHTTP(ctx, "http://"+addr+"/readyz", &p.logs)
	}
	idemdRedis, err := startIdemd("idemd (Redis)", "--store", redisURL)
	if err != nil {
		return err
	}
	idemdBolt, err := startIdemd("idemd (embedded)", "--data-dir", filepath.Join(dir, "bolt"))
	if err != nil {
		return err
	}

	all := []*configuration{
		{name: "a", title: "(a) no middleware", mode: ModeBare},
		{name: "b", title: "(b) direct-Redis middleware", mode: ModeDirect, usesRedis: true},
		{name: "c", title: "(c) idem.Middleware → idemd → Redis", mode: ModeIdemd, idemd: idemdRedis, usesRedis: true},
		{name: "d", title: "(d) idem.Middleware → idemd, embedded store", mode: ModeIdemd, idemd: idemdBolt},
		{name: "c1", title: "(c1) as (c), without batching", mode: ModeIdemd,
			idemd: idemdRedis, usesRedis: true, appFlags: []string{"-sdk-batching=false"}},
		{name: "c0", title: "(c0) as (c), the SDK's first settings: &http.Client{}, no replay cache, no batching", mode: ModeIdemd,
			idemd: idemdRedis, usesRedis: true, appFlags: []string{"-sdk-plain-http-client", "-sdk-replay-cache=false", "-sdk-batching=false"}},
	}
	var configs []*configuration
	for _, c := range all {
		if len(cfg.Configs) == 0 || slices.Contains(cfg.Configs, c.name) {
			configs = append(configs, c)
		}
	}
	for _, c := range configs {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		idemdURL := ""
		if c.idemd != nil {
			idemdURL = "http://" + c.idemd.addr
		}
		argv := append(slices.Clone(cfg.AppCommand), "-mode", c.mode, "-listen", addr, "-redis", redisURL, "-idemd", idemdURL)
		argv = append(append(argv, c.appFlags...), appFlags(cfg.AppFlags, c.name)...)
		if c.app, err = start("app "+c.name, argv...); err != nil {
			return err
		}
		c.app.addr = addr
		if err := waitHTTP(ctx, "http://"+addr+"/executions", &c.app.logs); err != nil {
			return err
		}
	}

	fmt.Fprintf(cfg.Out, "%d clients, %d requests per phase, %d rounds; redis-server %s\n",
		cfg.Clients, cfg.Requests, cfg.Rounds, redisVersion(cfg.RedisServer))
	if cfg.ServerCPUs != "" {
		fmt.Fprintf(cfg.Out, "load generator and apps on CPUs %s; redis-server and idemd on CPUs %s\n",
			allowedCPUs(), cfg.ServerCPUs)
	}
	fmt.Fprintln(cfg.Out)
	results := map[string][]rowResult{}
	for round := 1; round <= cfg.Rounds; round++ {
		for _, c := range configs {
			r, err := runConfiguration(ctx, cfg, c, redisProc, fmt.Sprintf("r%d-%d", round, time.Now().UnixNano()))
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, c.title, err)
			}
			results[c.name] = append(results[c.name], r)
		}
		fmt.Fprintf(cfg.Out, "### Round %d\n\n", round)
		printRound(cfg.Out, configs, results, round-1)
	}
	if cfg.Rounds > 1 {
		fmt.Fprintf(cfg.Out, "### All %d rounds: min – max\n\n", cfg.Rounds)
		printSpread(cfg.Out, configs, results)
	}
	return nil
}

// phaseResult is one phase of one configuration.
type phaseResult struct {
	requests, errors int
	elapsed          time.Duration
	p50, p99         time.Duration
	// cpu is the CPU time each process spent during the phase.
	app, idemd, redis, loadgen time.Duration
	// busy is the share of the whole machine's CPU that was in use.
	busy float64
	// executions is how many times the handler ran during the phase.
	executions int64
}

func (p phaseResult) rate() float64 { return float64(p.requests) / p.elapsed.Seconds() }

func (p phaseResult) perRequest(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(max(p.requests, 1))
}

type rowResult struct{ first, replay phaseResult }

func runConfiguration(ctx context.Context, cfg Config, c *configuration, redisProc *process, prefix string) (rowResult, error) {
	transport := &http.Transport{MaxIdleConns: cfg.Clients, MaxIdleConnsPerHost: cfg.Clients}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	base := "http://" + c.app.addr
	// Warm-up: connections, pools and caches, on keys of its own.
	warm := min(cfg.Requests/10+1, 2000)
	if _, err := phase(ctx, cfg, client, base, prefix+"-warm", warm, false, c, redisProc); err != nil {
		return rowResult{}, err
	}
	first, err := phase(ctx, cfg, client, base, prefix, cfg.Requests, false, c, redisProc)
	if err != nil {
		return rowResult{}, err
	}
	replay, err := phase(ctx, cfg, client, base, prefix, first.requests, c.mode != ModeBare, c, redisProc)
	if err != nil {
		return rowResult{}, err
	}
	if first.errors > 0 || replay.errors > 0 {
		return rowResult{}, fmt.Errorf("%d first requests and %d replays failed", first.errors, replay.errors)
	}
	if first.executions != int64(first.requests) {
		return rowResult{}, fmt.Errorf("%d first requests ran the handler %d times", first.requests, first.executions)
	}
	if c.mode != ModeBare && replay.executions != 0 {
		return rowResult{}, fmt.Errorf("%d replays ran the handler %d times", replay.requests, replay.executions)
	}
	return rowResult{first: first, replay: replay}, nil
}

// phase sends n requests with keys prefix-0 ... prefix-(n-1) from cfg.Clients
// concurrent clients, and reads the CPU of every process before and after. With
// replays it checks that every answer was marked replayed.
func phase(ctx context.Context, cfg Config, client *http.Client, base, prefix string, n int, replays bool, c *configuration, redisProc *process) (phaseResult, error) {
	if cfg.MaxPhase > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.MaxPhase)
		defer cancel()
	}
	execBefore, err := executions(client, base)
	if err != nil {
		return phaseResult{}, err
	}
	pids := []int{c.app.pid(), redisProc.pid(), os.Getpid()}
	if c.idemd != nil {
		pids = append(pids, c.idemd.pid())
	}
	cpuBefore, err := CPUTimes(pids)
	if err != nil {
		return phaseResult{}, err
	}
	busyBefore, totalBefore := machineTicks()

	var next, errs atomic.Int64
	lat := make([][]time.Duration, cfg.Clients)
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				t0 := time.Now()
				if err := send(ctx, client, base, prefix, i, replays); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	cpuAfter, err := CPUTimes(pids)
	if err != nil {
		return phaseResult{}, err
	}
	busyAfter, totalAfter := machineTicks()
	execAfter, err := executions(client, base)
	if err != nil {
		return phaseResult{}, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	res := phaseResult{requests: len(all), errors: int(errs.Load()), elapsed: elapsed,
		app: cpuAfter[0] - cpuBefore[0], redis: cpuAfter[1] - cpuBefore[1], loadgen: cpuAfter[2] - cpuBefore[2],
		executions: execAfter - execBefore}
	if c.idemd != nil {
		res.idemd = cpuAfter[3] - cpuBefore[3]
	}
	if totalAfter > totalBefore {
		res.busy = float64(busyAfter-busyBefore) / float64(totalAfter-totalBefore)
	}
	if len(all) > 0 {
		res.p50, res.p99 = all[len(all)/2], all[min(len(all)-1, len(all)*99/100)]
	}
	if e := firstErr.Load(); e != nil && res.errors > 0 {
		fmt.Fprintf(cfg.Out, "  %s: %d errors, the first: %v\n", c.title, res.errors, e)
	}
	return res, nil
}

func send(ctx context.Context, client *http.Client, base, prefix string, i int64, replay bool) error {
	body := `{"amount":` + strconv.FormatInt(i, 10) + `}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", prefix+"-"+strconv.FormatInt(i, 10))
	req.Header.Set("X-User", "user-"+strconv.FormatInt(i%100, 10))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if replay && resp.Header.Get("Idempotent-Replayed") != "true" {
		return fmt.Errorf("a replay was not marked replayed: %s", b)
	}
	return nil
}

func executions(client *http.Client, base string) (int64, error) {
	resp, err := client.Get(base + "/executions")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(b), 10, 64)
}

// clockTick is the unit of /proc's CPU times (USER_HZ), 100 per second on Linux.
const clockTick = 10 * time.Millisecond

// CPUTimes reads the user and system CPU time of each process from /proc/<pid>/stat.
func CPUTimes(pids []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return nil, err
		}
		// The command name may contain spaces; the fields after it do not.
		rest := string(b[bytes.LastIndexByte(b, ')')+2:])
		f := strings.Fields(rest)
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		out[i] = time.Duration(utime+stime) * clockTick
	}
	return out, nil
}

// allowedCPUs is the list of CPUs this process may run on, from /proc/self/status.
func allowedCPUs() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// machineTicks reads the busy and total CPU ticks of the whole machine from /proc/stat.
func machineTicks() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitTCP(ctx context.Context, addr string, logs *bytes.Buffer) error {
	return waitFor(ctx, addr, logs, func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func waitHTTP(ctx context.Context, url string, logs *bytes.Buffer) error {
	return waitFor(ctx, url, logs, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func waitFor(ctx context.Context, what string, logs *bytes.Buffer, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within 20 s\n%s", what, logs)
		case <-tick.C:
		}
	}
	return nil
}

func redisVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "?"
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return "?"
}

func printRound(w io.Writer, configs []*configuration, results map[string][]rowResult, i int) {
	fmt.Fprintln(w, "| configuration | S1 req/s | S2 req/s | S1 p50 / p99 ms | S2 p50 / p99 ms | app µs/req S1 / S2 | idemd µs/req S1 / S2 | Redis µs/req S1 / S2 | load generator µs/req S1 / S2 | machine busy S1 / S2 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range configs {
		r := results[c.name][i]
		idemdCol, redisCol := "–", "–"
		if c.idemd != nil {
			idemdCol = fmt.Sprintf("%.0f / %.0f", r.first.perRequest(r.first.idemd), r.replay.perRequest(r.replay.idemd))
		}
		if c.usesRedis {
			redisCol = fmt.Sprintf("%.0f / %.0f", r.first.perRequest(r.first.redis), r.replay.perRequest(r.replay.redis))
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.2f / %.2f | %.2f / %.2f | %.0f / %.0f | %s | %s | %.0f / %.0f | %.0f %% / %.0f %% |\n",
			c.title, r.first.rate(), r.replay.rate(), ms(r.first.p50), ms(r.first.p99), ms(r.replay.p50), ms(r.replay.p99),
			r.first.perRequest(r.first.app), r.replay.perRequest(r.replay.app), idemdCol, redisCol,
			r.first.perRequest(r.first.loadgen), r.replay.perRequest(r.replay.loadgen), 100*r.first.busy, 100*r.replay.busy)
	}
	if b, ok := results["b"]; ok {
		fmt.Fprintln(w)
		for _, c := range configs {
			if c.name == "b" {
				continue
			}
			r := results[c.name][i]
			fmt.Fprintf(w, "- %s against (b): S1 %.2f×, S2 %.2f×\n", c.title,
				r.first.rate()/b[i].first.rate(), r.replay.rate()/b[i].replay.rate())
		}
	}
	if c, ok := results["c"]; ok {
		for _, base := range []string{"c1", "c0"} {
			if b, ok := results[base]; ok {
				fmt.Fprintf(w, "- (c) against (%s): S1 %.2f×, S2 %.2f×; app CPU per request S1 %.2f×, S2 %.2f×\n", base,
					c[i].first.rate()/b[i].first.rate(), c[i].replay.rate()/b[i].replay.rate(),
					c[i].first.perRequest(c[i].first.app)/b[i].first.perRequest(b[i].first.app),
					c[i].replay.perRequest(c[i].replay.app)/b[i].replay.perRequest(b[i].replay.app))
			}
		}
	}
	fmt.Fprintln(w)
}

func printSpread(w io.Writer, configs []*configuration, results map[string][]rowResult) {
	fmt.Fprintln(w, "| configuration | S1 req/s | S2 req/s | S1 p99 ms | S2 p99 ms | app µs/req S1 | app µs/req S2 | S1 vs (b) | S2 vs (b) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	spread := func(rs []rowResult, f func(rowResult) float64, format string) string {
		lo, hi := f(rs[0]), f(rs[0])
		for _, r := range rs[1:] {
			lo, hi = min(lo, f(r)), max(hi, f(r))
		}
		return fmt.Sprintf(format+" – "+format, lo, hi)
	}
	b := results["b"]
	for _, c := range configs {
		rs := results[c.name]
		vsB1, vsB2 := "–", "–"
		if b != nil && c.name != "b" {
			ratios := make([]rowResult, len(rs))
			for i := range rs {
				// Ratios per round, so that each compares runs made side by side.
				ratios[i] = rowResult{
					first:  phaseResult{requests: 1, elapsed: time.Duration(float64(time.Second) * b[i].first.rate() / rs[i].first.rate())},
					replay: phaseResult{requests: 1, elapsed: time.Duration(float64(time.Second) * b[i].replay.rate() / rs[i].replay.rate())},
				}
			}
			vsB1 = spread(ratios, func(r rowResult) float64 { return r.first.rate() }, "%.2f×")
			vsB2 = spread(ratios, func(r rowResult) float64 { return r.replay.rate() }, "%.2f×")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.title,
			spread(rs, func(r rowResult) float64 { return r.first.rate() }, "%.0f"),
			spread(rs, func(r rowResult) float64 { return r.replay.rate() }, "%.0f"),
			spread(rs, func(r rowResult) float64 { return ms(r.first.p99) }, "%.1f"),
			spread(rs, func(r rowResult) float64 { return ms(r.replay.p99) }, "%.1f"),
			spread(rs, func(r rowResult) float64 { return r.first.perRequest(r.first.app) }, "%.0f"),
			spread(rs, func(r rowResult) float64 { return r.replay.perRequest(r.replay.app) }, "%.0f"),
			vsB1, vsB2)
	}
	fmt.Fprintln(w)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// appFlags is flags with {config} replaced by name in each.
func appFlags(flags []string, name string) []string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = strings.ReplaceAll(f, "{config}", name)
	}
	return out
}
