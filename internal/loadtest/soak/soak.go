// Package soak runs idemd for a long time under load and faults and watches for what
// only time shows: a resource that grows without levelling off, and an acknowledged
// completion that is lost.
//
// It starts its own redis-server (append-only, fsync on every write) and an idemd
// over it, through a relay on loopback that can cut the link; drives every path of
// the API from many clients; restarts Redis and cuts the link at intervals; and
// samples the daemon and Redis. See Run, and the Soak section of docs/operations.md.
package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config is what a soak runs.
type Config struct {
	// Duration bounds the run; it stops by itself once Duration has passed.
	Duration time.Duration
	// Sample is the interval between samples.
	Sample time.Duration
	// Clients is how many clients send operations, together at most Rate a second.
	Clients int
	Rate    float64
	// Retention is idemd's --retention, which most completions keep: short, so that
	// the records of a steady load reach a steady count within the run.
	Retention time.Duration
	// KeepFirst is how long from the start the completions are kept for the whole
	// run (with a retention longer than the run), and checked at every sample; at
	// most FirstMax of them. After it the book keeps the last RingSize.
	KeepFirst time.Duration
	FirstMax  int
	RingSize  int
	// FaultEvery is the interval between faults, which take turns: a dropped link, a
	// Redis restart by SIGTERM, a stalled link, a Redis restart by SIGKILL. CutFor is
	// how long a cut lasts. Zero FaultEvery injects none.
	FaultEvery time.Duration
	CutFor     time.Duration
	// Idemd is the idemd binary; empty builds cmd/idemd of the module in the working
	// directory. RedisServer is redis-server's path; empty finds it on the PATH.
	Idemd       string
	RedisServer string
	// Dir holds Redis's data and the logs; empty makes a temporary one, removed at
	// the end unless the run failed.
	Dir string
	// Out receives a table row per sample, or with JSON a JSON object per line.
	Out  io.Writer
	JSON bool
}

// Defaults returns the settings of an hour-long soak.
func Defaults() Config {
	return Config{
		Duration: time.Hour, Sample: time.Minute, Clients: 32, Rate: 200,
		Retention: 30 * time.Second, KeepFirst: time.Minute, FirstMax: 5000, RingSize: 10000,
		FaultEvery: 2 * time.Minute, CutFor: 5 * time.Second, Out: os.Stdout,
	}
}

func (c Config) validate() error {
	switch {
	case c.Duration <= 0 || c.Sample <= 0:
		return errors.New("the duration and the sample interval must be positive")
	case c.Duration < 6*c.Sample:
		return fmt.Errorf("a duration of %s gives fewer than 6 samples of %s: too few to tell growth from a level", c.Duration, c.Sample)
	case c.Clients < 1 || c.Rate <= 0:
		return errors.New("there must be at least one client and a positive rate")
	case c.Retention < time.Second:
		return errors.New("the retention must be at least 1s")
	case c.FirstMax < 0 || c.RingSize < 1:
		return errors.New("the book must keep at least one recent completion")
	case c.FaultEvery < 0 || (c.FaultEvery > 0 && (c.CutFor <= 0 || c.CutFor >= c.FaultEvery)):
		return errors.New("a cut must last less than the interval between faults")
	}
	return nil
}

// Sample is one row of the table.
type Sample struct {
	Elapsed    time.Duration    `json:"elapsed_ns"`
	Calls      int64            `json:"calls"`
	P99        time.Duration    `json:"p99_ns"`
	Errors     map[string]int64 `json:"errors"`
	Goroutines int64            `json:"goroutines"`
	OpenFDs    int64            `json:"open_fds"`
	RSS        int64            `json:"rss_bytes"`
	Series     int64            `json:"series"`
	RedisKeys  int64            `json:"redis_keys"`
	RedisMem   int64            `json:"redis_used_memory_bytes"`
	// StoreRecords are the records in Redis, counted by SCAN, and UsageRecords what the
	// store's usage counts of them right after (docs/sizing.md, Quotas): it may
	// count a record up to a span after it expired, never fewer than are there.
	StoreRecords int64 `json:"store_records"`
	UsageRecords int64 `json:"usage_records"`
	checkResult
	LostTotal int      `json:"lost_total"`
	Faults    []string `json:"faults"`
	// ops and anomalies are summed into the report rather than shown per row.
	ops, anomalies map[string]int64
}

// Report is the outcome of a soak.
type Report struct {
	Samples   []Sample         `json:"-"`
	Levels    []Level          `json:"levels"`
	Lost      int              `json:"lost"`
	LostKeys  []string         `json:"lost_keys,omitempty"`
	Ops       map[string]int64 `json:"ops"`
	Anomalies map[string]int64 `json:"anomalies"`
	// Surprises describe the first answers the contract rules out (a problem no
	// client should receive), with the call and how long it took.
	Surprises []string `json:"surprises,omitempty"`
	Failures  []string `json:"failures"`
	Dir       string   `json:"dir,omitempty"`
}

// Failed says whether the soak found a loss or a growth.
func (r Report) Failed() bool { return len(r.Failures) > 0 }

// Run starts Redis and idemd, drives them under faults for cfg.Duration, samples them
// every cfg.Sample, and stops them. The error is for a soak that could not run; what
// the soak found is in the report (Failed). Ending ctx (an interrupt) stops the run
// early and still stops every process it started.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if err := cfg.validate(); err != nil {
		return rep, err
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	// Samples and faults are printed from different goroutines.
	cfg.Out = &lockedWriter{w: cfg.Out}
	redisBin := cfg.RedisServer
	if redisBin == "" {
		if redisBin, err = exec.LookPath("redis-server"); err != nil {
			return rep, fmt.Errorf("redis-server not found: %w", err)
		}
	}
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "idemd-soak-"); err != nil {
			return rep, err
		}
		// A failed run keeps its logs and data to look at.
		defer func() {
			if err == nil && !rep.Failed() {
				_ = os.RemoveAll(dir)
			} else {
				rep.Dir = dir
			}
		}()
	}
	for _, sub := range []string{"redis", "idemd", "bin"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return rep, err
		}
	}
	bin := cfg.Idemd
	if bin == "" {
		if bin, err = buildIdemd(ctx, filepath.Join(dir, "bin")); err != nil {
			return rep, err
		}
	}
	redisLog, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		return rep, err
	}
	defer redisLog.Close()
	idemdLog, err := os.Create(filepath.Join(dir, "idemd.log"))
	if err != nil {
		return rep, err
	}
	defer idemdLog.Close()

	rs, err := startRedis(ctx, redisBin, filepath.Join(dir, "redis"), redisLog)
	if err != nil {
		return rep, err
	}
	// The deferred stops run last to first: idemd, then the link, then Redis.
	defer func() { rs.proc.stop(syscall.SIGTERM, 30*time.Second) }()
	lk, err := newLink(rs.Addr())
	if err != nil {
		return rep, err
	}
	linkCtx, stopLink := context.WithCancel(context.Background())
	linkDone := make(chan struct{})
	go func() { lk.serve(linkCtx); close(linkDone) }()
	defer func() { stopLink(); <-linkDone }()
	idemd, base, err := startIdemd(ctx, bin, "redis://"+lk.Addr()+"/0", filepath.Join(dir, "idemd"), cfg.Retention, idemdLog)
	if err != nil {
		return rep, fmt.Errorf("%w (see %s)", err, idemdLog.Name())
	}
	defer idemd.stop(syscall.SIGTERM, 30*time.Second)

	s := &soak{cfg: cfg, redis: rs, link: lk, idemd: idemd, base: base, start: time.Now()}
	return s.run(ctx)
}

// soak is one run in progress.
type soak struct {
	cfg   Config
	redis *redisServer
	link  *link
	idemd *child
	base  string
	start time.Time

	load *load
	// quiet is held by a fault from its start until the daemon has had a moment to
	// recover, and by a sample while it measures: samples never see a fault in
	// progress, so that the requests a fault holds up do not read as growth.
	quiet  sync.Mutex
	faults struct {
		sync.Mutex
		names []string
	}
}

// settle is how long after a fault the daemon is left to recover before a sample.
const settle = 3 * time.Second

func (s *soak) run(ctx context.Context) (Report, error) {
	cfg := s.cfg
	deadline := s.start.Add(cfg.Duration)
	loadCtx, stopLoad := context.WithDeadline(ctx, deadline)
	defer stopLoad()
	transport := &http.Transport{MaxIdleConns: 4 * cfg.Clients, MaxIdleConnsPerHost: 4 * cfg.Clients,
		IdleConnTimeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	s.load = &load{
		base: s.base, prefix: "soak-" + strconv.FormatInt(s.start.UnixNano(), 36) + "-",
		http:  &http.Client{Transport: transport, Timeout: 30 * time.Second},
		stats: newStats(), book: newAckBook(cfg.FirstMax, cfg.RingSize), retention: cfg.Retention,
		start: s.start, keepFirst: cfg.KeepFirst, longKeep: cfg.Duration + 10*time.Minute,
	}
	var wg sync.WaitGroup
	every := time.Duration(float64(cfg.Clients) / cfg.Rate * float64(time.Second))
	for range cfg.Clients {
		wg.Add(1)
		go func() { defer wg.Done(); s.load.worker(loadCtx, every) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for pause(loadCtx, time.Second) {
			s.load.feed(loadCtx)
		}
	}()
	faultErr := make(chan error, 1)
	if cfg.FaultEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); faultErr <- s.inject(ctx, loadCtx) }()
	}

	s.header()
	var rep Report
	var runErr error
	samples := int(cfg.Duration / cfg.Sample)
	for i := 1; i <= samples && runErr == nil; i++ {
		if !pause(ctx, time.Until(s.start.Add(time.Duration(i)*cfg.Sample))) {
			runErr = ctx.Err()
			break
		}
		if s.idemd.Exited() {
			runErr = errors.New("idemd exited during the soak (see its log)")
			break
		}
		row := s.sample(ctx)
		rep.Samples = append(rep.Samples, row)
		s.print(row)
		select {
		case runErr = <-faultErr:
		default:
		}
	}
	stopLoad()
	wg.Wait()
	if runErr == nil {
		select {
		case runErr = <-faultErr:
		default:
		}
	}
	rep = s.judge(rep)
	s.verdict(rep)
	return rep, runErr
}

// inject runs the faults in turn every cfg.FaultEvery until loadCtx ends. A Redis
// restart that fails ends the soak with its error.
func (s *soak) inject(ctx, loadCtx context.Context) error {
	kinds := []string{"cut-drop", "restart-term", "cut-stall", "restart-kill"}
	for n := 0; ; n++ {
		if !pause(loadCtx, time.Until(s.start.Add(time.Duration(n+1)*s.cfg.FaultEvery))) {
			return nil
		}
		kind := kinds[n%len(kinds)]
		// A fault that would not be over, and settled, before the end is not started:
		// the last sample would wait for it and measure nothing of it.
		if deadline, _ := loadCtx.Deadline(); time.Until(deadline) < s.cfg.CutFor+settle {
			return nil
		}
		s.quiet.Lock()
		began := time.Now()
		var err error
		switch kind {
		case "cut-drop":
			s.link.Cut(cutDrop)
			pause(ctx, s.cfg.CutFor)
			s.link.Restore()
		case "cut-stall":
			s.link.Cut(cutStall)
			pause(ctx, s.cfg.CutFor)
			s.link.Restore()
		case "restart-term":
			err = s.redis.restart(ctx, syscall.SIGTERM)
		case "restart-kill":
			err = s.redis.restart(ctx, syscall.SIGKILL)
		}
		took := time.Since(began)
		s.faults.Lock()
		s.faults.names = append(s.faults.names, kind)
		s.faults.Unlock()
		s.event(kind, took, err)
		pause(ctx, settle)
		s.quiet.Unlock()
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
	}
}

func (s *soak) sample(ctx context.Context) Sample {
	s.quiet.Lock()
	defer s.quiet.Unlock()
	row := Sample{Elapsed: time.Since(s.start).Round(time.Second)}
	row.Calls, row.P99, row.Errors, row.ops, row.anomalies = s.load.stats.swap()
	s.faults.Lock()
	row.Faults, s.faults.names = s.faults.names, nil
	s.faults.Unlock()
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m, err := scrape(mctx, s.load.http, s.base); err == nil {
		row.Goroutines, row.OpenFDs, row.RSS, row.Series = m.goroutines, m.openFDs, m.rss, m.series
	} else {
		row.Goroutines, row.OpenFDs, row.RSS, row.Series = -1, -1, -1, -1
	}
	client := s.redis.client()
	defer client.Close()
	if mem, keys, err := redisInfo(mctx, client); err == nil {
		row.RedisMem, row.RedisKeys = mem, keys
	} else {
		row.RedisMem, row.RedisKeys = -1, -1
	}
	row.StoreRecords, row.UsageRecords = countRecords(mctx, client, "redis://"+s.redis.Addr())
	row.checkResult = s.load.book.check(ctx, s.load.http, s.base, 8)
	row.LostTotal = s.load.book.lostCount()
	return row
}

// daemonMetrics is what the soak reads from idemd's /metrics.
type daemonMetrics struct {
	goroutines, openFDs, rss, series int64
}

func scrape(ctx context.Context, client *http.Client, base string) (daemonMetrics, error) {
	var m daemonMetrics
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	if err != nil {
		return m, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return m, err
	}
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("/metrics answered %d", resp.StatusCode)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m.series++
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_goroutines":
			m.goroutines = int64(v)
		case "process_open_fds":
			m.openFDs = int64(v)
		case "process_resident_memory_bytes":
			m.rss = int64(v)
		}
	}
	return m, nil
}

// Level is the levelling verdict on one measure.
type Level struct {
	Measure string `json:"measure"`
	MidMax  int64  `json:"middle_third_max"`
	LastMax int64  `json:"last_third_max"`
	Allowed int64  `json:"allowed"`
	Levels  bool   `json:"levels"`
}

// slack is how far a measure's last third may rise over its middle third and still
// count as level: a share of the middle third's maximum plus a floor, because each
// measure also moves with what is in flight at the moment of the sample.
var slacks = []struct {
	measure string
	share   float64
	floor   int64
	value   func(Sample) int64
}{
	{"goroutines", 0.25, 20, func(r Sample) int64 { return r.Goroutines }},
	{"open_fds", 0.25, 10, func(r Sample) int64 { return r.OpenFDs }},
	{"rss_bytes", 0.25, 16 << 20, func(r Sample) int64 { return r.RSS }},
	{"series", 0.05, 40, func(r Sample) int64 { return r.Series }},
	{"redis_keys", 0.25, 100, func(r Sample) int64 { return r.RedisKeys }},
	{"redis_used_memory_bytes", 0.25, 4 << 20, func(r Sample) int64 { return r.RedisMem }},
	{"usage_records", 0.25, 100, func(r Sample) int64 { return r.UsageRecords }},
}

// LevellingRule says in words what levels computes; the command's help and the docs
// quote it.
const LevellingRule = `A measure levels off when the largest value of the last third of the samples is at
most the largest value of the middle third plus a slack: 25 % (plus 20) for
goroutines, 25 % (plus 10) for open fds, 25 % (plus 16 MiB) for RSS, 5 % (plus 40)
for metric series, 25 % (plus 100) for Redis keys, 25 % (plus 4 MiB) for Redis
used_memory and 25 % (plus 100) for the records the usage counts. The first third
is warm-up: with a retention much shorter than a third of the run, the records of a
steady load reach their steady count in it.`

// levels applies LevellingRule to each measure.
func levels(rows []Sample) []Level {
	n := len(rows)
	mid, last := rows[n/3:2*n/3], rows[2*n/3:]
	top := func(rs []Sample, value func(Sample) int64) int64 {
		m := int64(-1)
		for _, r := range rs {
			m = max(m, value(r))
		}
		return m
	}
	var out []Level
	for _, sl := range slacks {
		l := Level{Measure: sl.measure, MidMax: top(mid, sl.value), LastMax: top(last, sl.value)}
		l.Allowed = l.MidMax + int64(float64(l.MidMax)*sl.share) + sl.floor
		l.Levels = l.LastMax <= l.Allowed
		out = append(out, l)
	}
	return out
}

// judge applies the verdicts: any acknowledged completion lost, and any measure that
// does not level off, fails the soak.
func (s *soak) judge(rep Report) Report {
	rep.Ops, rep.Anomalies = map[string]int64{}, map[string]int64{}
	for _, r := range rep.Samples {
		for k, v := range r.ops {
			rep.Ops[k] += v
		}
		for k, v := range r.anomalies {
			rep.Anomalies[k] += v
		}
	}
	s.load.surprisesMu.Lock()
	rep.Surprises = slices.Clone(s.load.surprises)
	s.load.surprisesMu.Unlock()
	rep.Lost = s.load.book.lostCount()
	rep.LostKeys = s.load.book.lostKeys(20)
	if rep.Lost > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d acknowledged completions lost", rep.Lost))
	}
	if len(rep.Samples) < 6 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("only %d samples: too few to judge levelling", len(rep.Samples)))
		return rep
	}
	rep.Levels = levels(rep.Samples)
	for _, l := range rep.Levels {
		if !l.Levels {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s does not level off: %d in the last third, over %d allowed from %d in the middle third",
				l.Measure, l.LastMax, l.Allowed, l.MidMax))
		}
	}
	return rep
}

const rowFormat = "%8s %7s %7s %5s %4s %7s %6s %9s %9s %7s %9s %4s  %s\n"

func (s *soak) header() {
	if s.cfg.JSON {
		return
	}
	fmt.Fprintf(s.cfg.Out, rowFormat, "elapsed", "calls", "p99_ms", "gorou", "fds", "rss_MiB", "series",
		"redis_key", "redis_MiB", "checked", "unchecked", "lost", "errors by code; faults")
}

func mib(b int64) string {
	if b < 0 {
		return "?"
	}
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64)
}

func (s *soak) print(r Sample) {
	if s.cfg.JSON {
		s.emit(map[string]any{"type": "sample", "sample": r})
		return
	}
	var errs []string
	for _, code := range slices.Sorted(maps.Keys(r.Errors)) {
		errs = append(errs, fmt.Sprintf("%s=%d", code, r.Errors[code]))
	}
	tail := strings.Join(errs, " ")
	if len(r.Faults) > 0 {
		tail += "; " + strings.Join(r.Faults, " ")
	}
	fmt.Fprintf(s.cfg.Out, rowFormat, r.Elapsed, strconv.FormatInt(r.Calls, 10),
		strconv.FormatFloat(float64(r.P99)/float64(time.Millisecond), 'f', 1, 64),
		strconv.FormatInt(r.Goroutines, 10), strconv.FormatInt(r.OpenFDs, 10), mib(r.RSS),
		strconv.FormatInt(r.Series, 10), strconv.FormatInt(r.RedisKeys, 10), mib(r.RedisMem),
		strconv.Itoa(r.Checked), strconv.Itoa(r.Unchecked), strconv.Itoa(r.LostTotal), tail)
}

func (s *soak) event(kind string, took time.Duration, err error) {
	if s.cfg.JSON {
		ev := map[string]any{"type": "fault", "elapsed_ns": time.Since(s.start), "fault": kind, "took_ns": took}
		if err != nil {
			ev["error"] = err.Error()
		}
		s.emit(ev)
		return
	}
	msg := fmt.Sprintf("# %s %s, %s", time.Since(s.start).Round(time.Second), kind, took.Round(time.Millisecond))
	if err != nil {
		msg += ": " + err.Error()
	}
	fmt.Fprintln(s.cfg.Out, msg)
}

func (s *soak) verdict(rep Report) {
	if s.cfg.JSON {
		s.emit(map[string]any{"type": "verdict", "report": rep})
		return
	}
	out := s.cfg.Out
	fmt.Fprintln(out)
	for _, l := range rep.Levels {
		word := "levels off"
		if !l.Levels {
			word = "GROWS"
		}
		fmt.Fprintf(out, "%-24s middle third max %d, last third max %d (allowed %d): %s\n", l.Measure, l.MidMax, l.LastMax, l.Allowed, word)
	}
	fmt.Fprintf(out, "operations: %s\n", counts(rep.Ops))
	fmt.Fprintf(out, "anomalies: %s\n", counts(rep.Anomalies))
	for _, what := range rep.Surprises {
		fmt.Fprintf(out, "  at %s\n", what)
	}
	fmt.Fprintf(out, "acknowledged completions lost: %d\n", rep.Lost)
	for _, k := range rep.LostKeys {
		fmt.Fprintf(out, "  lost %s\n", k)
	}
	if rep.Failed() {
		fmt.Fprintf(out, "FAIL: %s\n", strings.Join(rep.Failures, "; "))
	} else {
		fmt.Fprintln(out, "PASS")
	}
}

func counts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func (s *soak) emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	fmt.Fprintf(s.cfg.Out, "%s\n", b)
}

// lockedWriter lets several goroutines print whole lines (each a single Write) to one
// writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
