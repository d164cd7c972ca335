// Package floorbench measures idemd against the floor: the least an HTTP service that
// decodes the same JSON and runs one script in Redis per request can cost on the same
// machine (../shared/bench/floor). It starts the floor, idemd over Redis and idemd over
// the embedded store, each with a redis-server of its own, and runs the load generator
// (cmd/idemd-load) in a process of its own against each in turn, alternating the order
// round by round, and reads every process's CPU from /proc/<pid>/stat before and after
// each run. Over a Redis Cluster of 1, 2, 3 ... masters it measures instead the CPU
// each master and each daemon spends per cycle, the ground of docs/benchmarks.md's
// model of scale-out. RunAtSize measures the stores at millions of records instead
// (docs/bench-size.md). cmd/idemd-floorbench wires it.
package floorbench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemd/idemd/internal/loadtest/loadgen"
	"github.com/idemd/idemd/internal/loadtest/proc"
)

// Config says what to run and how much.
type Config struct {
	// FloorDir is the floor's source, built into a temporary directory.
	FloorDir string
	// ModuleDir is this repository's root, where ./cmd/idemd and ./cmd/idemd-load
	// are built from.
	ModuleDir string
	// Idemd is an idemd binary to measure instead of building one.
	Idemd       string
	RedisServer string
	// Targets selects what to measure, from floor, redis and embedded; the first is
	// the one the others are compared with.
	Targets []string
	// Clients are the numbers of concurrent clients to run every target with.
	Clients []int
	// Rounds repeats every target at every number of clients, rotating their order.
	Rounds int
	// Cycles is the claim+complete cycles of each run; Duration stops a run earlier.
	Cycles   int
	Duration time.Duration
	// Masters, when set, measures Redis Clusters of these many masters instead of
	// the floor, with the clients shared out among the daemons.
	Masters []int
	// Daemons is how many idemd daemons serve each cluster; 0 means one per master.
	Daemons int
	// ClientsPerMaster runs a cluster of N masters with N times the clients and the
	// cycles, so that each master has the same load whatever N.
	ClientsPerMaster bool
	// Perf, when set, is a directory where `perf record` writes a profile of every
	// server process during the first round's run at the most clients.
	Perf string
	Out  io.Writer
}

// target is one server measured: the processes that serve it and the Redis processes
// behind it.
type target struct {
	name, title string
	urls        []string
	servers     []*proc.Process
	redis       []*proc.Process
}

type bench struct {
	cfg  Config
	dir  string
	ps   *proc.Group
	load string // the idemd-load binary
	// readyWithin bounds a daemon's start-up; zero is the package's readyWithin.
	readyWithin time.Duration
}

// Run builds the floor, idemd and idemd-load, starts every process on loopback, runs
// the rounds, prints each run and the summary to cfg.Out, and stops every process it
// started.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Rounds <= 0 || cfg.Cycles <= 0 || len(cfg.Clients) == 0 || slices.ContainsFunc(cfg.Clients, func(c int) bool { return c <= 0 }) {
		return errors.New("rounds, cycles and clients must be positive")
	}
	if slices.ContainsFunc(cfg.Masters, func(n int) bool { return n <= 0 || n > 16 }) {
		return errors.New("masters must be between 1 and 16")
	}
	if cfg.ModuleDir == "" {
		cfg.ModuleDir = "."
	}
	dir, err := os.MkdirTemp("", "idemd-floorbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{cfg: cfg, dir: dir, ps: &proc.Group{}}
	defer b.ps.Stop(stopGrace)
	if err := b.build(ctx); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "%d cores, load average %s at the start; redis-server %s\n", runtime.NumCPU(), loadAverage(), redisVersion(cfg.RedisServer))
	if len(cfg.Masters) > 0 {
		err = b.runCluster(ctx)
	} else {
		err = b.runFloor(ctx)
	}
	fmt.Fprintf(cfg.Out, "\nload average %s at the end\n", loadAverage())
	return err
}

func (b *bench) build(ctx context.Context) error {
	goBuild := func(dir string, env []string, args ...string) error {
		cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
		}
		return nil
	}
	fmt.Fprintln(b.cfg.Out, "building idemd-load, idemd and the floor ...")
	b.load = filepath.Join(b.dir, "idemd-load")
	pkgs := []string{"./cmd/idemd-load"}
	if b.cfg.Idemd == "" {
		b.cfg.Idemd = filepath.Join(b.dir, "idemd")
		pkgs = append(pkgs, "./cmd/idemd")
	}
	if err := goBuild(b.cfg.ModuleDir, nil, append([]string{"-o", b.dir + "/"}, pkgs...)...); err != nil {
		return err
	}
	if len(b.cfg.Masters) > 0 || !slices.Contains(b.cfg.Targets, "floor") {
		return nil
	}
	if _, err := os.Stat(filepath.Join(b.cfg.FloorDir, "main.go")); err != nil {
		return fmt.Errorf("the floor's source is not at %s (-floor): %w", b.cfg.FloorDir, err)
	}
	// The floor is a module of its own, outside this repository's go.work.
	return goBuild(b.cfg.FloorDir, []string{"GOWORK=off"}, "-o", filepath.Join(b.dir, "floor"), ".")
}

// startRedis starts a redis-server on a free loopback port, with persistence off and
// the extra arguments.
func (b *bench) startRedis(ctx context.Context, name string, extra ...string) (*proc.Process, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.dir, "redis-"+strconv.Itoa(port))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := append([]string{b.cfg.RedisServer, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no"}, extra...)
	p, err := b.ps.Start(name, "", args...)
	if err != nil {
		return nil, err
	}
	p.Addr = "127.0.0.1:" + strconv.Itoa(port)
	return p, waitTCP(ctx, p)
}

func (b *bench) startIdemd(ctx context.Context, name string, args ...string) (*proc.Process, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	p, err := b.ps.Start(name, "", append([]string{b.cfg.Idemd, "--listen", addr, "--log-level", "warn"}, args...)...)
	if err != nil {
		return nil, err
	}
	p.Addr = addr
	return p, waitHTTP(ctx, cmp.Or(b.readyWithin, readyWithin), p, "http://"+addr+"/readyz")
}

func (b *bench) targets(ctx context.Context) ([]*target, error) {
	var out []*target
	for _, name := range b.cfg.Targets {
		switch name {
		case "floor":
			redis, err := b.startRedis(ctx, "redis-server (floor)")
			if err != nil {
				return nil, err
			}
			addr, err := proc.FreeAddr()
			if err != nil {
				return nil, err
			}
			floor, err := b.ps.Start("floor", "", filepath.Join(b.dir, "floor"), redis.Addr, addr)
			if err != nil {
				return nil, err
			}
			floor.Addr = addr
			if err := waitTCP(ctx, floor); err != nil {
				return nil, err
			}
			out = append(out, &target{name: name, title: "floor", urls: []string{"http://" + addr}, servers: []*proc.Process{floor}, redis: []*proc.Process{redis}})
		case "redis":
			redis, err := b.startRedis(ctx, "redis-server (idemd)")
			if err != nil {
				return nil, err
			}
			idemd, err := b.startIdemd(ctx, "idemd (Redis)", "--store", "redis://"+redis.Addr+"/0")
			if err != nil {
				return nil, err
			}
			out = append(out, &target{name: name, title: "idemd, Redis", urls: []string{"http://" + idemd.Addr}, servers: []*proc.Process{idemd}, redis: []*proc.Process{redis}})
		case "embedded":
			idemd, err := b.startIdemd(ctx, "idemd (embedded)", "--data-dir", filepath.Join(b.dir, "bolt"))
			if err != nil {
				return nil, err
			}
			out = append(out, &target{name: name, title: "idemd, embedded store", urls: []string{"http://" + idemd.Addr}, servers: []*proc.Process{idemd}})
		default:
			return nil, fmt.Errorf("unknown target %q: floor, redis or embedded", name)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no target")
	}
	return out, nil
}

// generate runs idemd-load in a process of its own and returns what it measured,
// its own CPU included.
func (b *bench) generate(ctx context.Context, urls []string, clients, cycles int, prefix string) (loadgen.Result, error) {
	args := []string{"-url", strings.Join(urls, ","), "-clients", strconv.Itoa(clients), "-cycles", strconv.Itoa(cycles),
		"-key-prefix", prefix, "-json"}
	if b.cfg.Duration > 0 {
		args = append(args, "-duration", b.cfg.Duration.String())
	}
	cmd := exec.CommandContext(ctx, b.load, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var res loadgen.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return res, fmt.Errorf("idemd-load: %v %v\n%s%s", runErr, err, stdout.String(), stderr.String())
	}
	if runErr != nil {
		return res, fmt.Errorf("idemd-load: %v (the first error: %s)\n%s", runErr, res.FirstError, stderr.String())
	}
	return res, nil
}

// measure runs the generator against t and reads the CPU of t's processes around it.
func (b *bench) measure(ctx context.Context, t *target, clients int, prefix string, perf bool) (sample, error) {
	pids := make([]int, 0, len(t.servers)+len(t.redis))
	for _, p := range slices.Concat(t.servers, t.redis) {
		pids = append(pids, p.PID())
	}
	var stopPerf func()
	if perf {
		var err error
		if stopPerf, err = b.perfRecord(t); err != nil {
			return sample{}, err
		}
	}
	before, err := cpuOf(pids)
	if err != nil {
		return sample{}, err
	}
	res, err := b.generate(ctx, t.urls, clients, b.cfg.Cycles, prefix)
	if err != nil {
		return sample{}, fmt.Errorf("%s: %w", t.title, err)
	}
	after, err := cpuOf(pids)
	if err != nil {
		return sample{}, err
	}
	if stopPerf != nil {
		stopPerf()
	}
	s := sample{target: t.name, clients: clients, cycles: res.Cycles, errors: res.Errors, firstErr: res.FirstError, elapsed: res.Elapsed,
		claimP50: res.ClaimP50, claimP99: res.ClaimP99, generator: res.CPU}
	for i := range t.servers {
		s.server += after[i] - before[i]
	}
	for i := len(t.servers); i < len(pids); i++ {
		s.redis += after[i] - before[i]
	}
	return s, nil
}

// perfRecord starts `perf record` on each of t's servers, and returns what stops them
// (SIGINT, by PID, which makes perf write its file).
func (b *bench) perfRecord(t *target) (func(), error) {
	if err := os.MkdirAll(b.cfg.Perf, 0o755); err != nil {
		return nil, err
	}
	var recs []*proc.Process
	for i, p := range t.servers {
		out := filepath.Join(b.cfg.Perf, fmt.Sprintf("%s-%d.perf.data", t.name, i))
		r, err := b.ps.Start("perf record "+t.name, "", "perf", "record", "-F", "1999", "-g", "-o", out, "-p", strconv.Itoa(p.PID()))
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	// perf attaches within a moment; a run lasts seconds.
	return func() {
		for _, r := range recs {
			r.Stop(syscall.SIGINT, 30*time.Second)
			fmt.Fprintf(b.cfg.Out, "perf: %s", r.Logs.String())
		}
	}, nil
}

// warm sends a few cycles to t, so that connections, pools and scripts are ready.
func (b *bench) warm(ctx context.Context, t *target) error {
	_, err := b.generate(ctx, t.urls, min(8, slices.Max(b.cfg.Clients)), min(b.cfg.Cycles, 1000), fmt.Sprintf("warm-%s-%d", t.name, time.Now().UnixNano()))
	if err != nil {
		return fmt.Errorf("warming %s up: %w", t.title, err)
	}
	return nil
}

func (b *bench) runFloor(ctx context.Context) error {
	targets, err := b.targets(ctx)
	if err != nil {
		return err
	}
	for _, t := range targets {
		if err := b.warm(ctx, t); err != nil {
			return err
		}
	}
	fmt.Fprintf(b.cfg.Out, "%d rounds of %d cycles%s a run, clients %v\n\n", b.cfg.Rounds, b.cfg.Cycles, b.atMost(), b.cfg.Clients)
	results := map[int]map[string][]sample{}
	for _, c := range b.cfg.Clients {
		results[c] = map[string][]sample{}
	}
	most := slices.Max(b.cfg.Clients)
	for round := 1; round <= b.cfg.Rounds; round++ {
		for _, c := range b.cfg.Clients {
			for i := range targets {
				// The order turns round by round, so that no target always runs first.
				t := targets[(i+round-1)%len(targets)]
				s, err := b.measure(ctx, t, c, fmt.Sprintf("r%d-c%d-%s-%d", round, c, t.name, time.Now().UnixNano()),
					b.cfg.Perf != "" && round == 1 && c == most)
				if err != nil {
					return fmt.Errorf("round %d, %d clients: %w", round, c, err)
				}
				printSample(b.cfg.Out, round, s, t.redis != nil)
				results[c][t.name] = append(results[c][t.name], s)
			}
		}
	}
	for _, c := range b.cfg.Clients {
		printSummary(b.cfg.Out, c, targets, results[c])
	}
	return nil
}

// atMost says how long a run may last.
func (b *bench) atMost() string {
	if b.cfg.Duration <= 0 {
		return ""
	}
	return " (at most " + b.cfg.Duration.String() + ")"
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
