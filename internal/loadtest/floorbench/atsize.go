package floorbench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/loadtest/proc"
)

// SizeConfig says what the at-size bench fills and measures.
type SizeConfig struct {
	// ModuleDir is this repository's root, where idemd, idemd-load and idemctl are
	// built from; Idemd, when set, is an idemd binary to use instead.
	ModuleDir   string
	Idemd       string
	RedisServer string
	// Stores are the deployments to measure: embedded, redis (one Redis) and cluster
	// (a Redis Cluster of three masters).
	Stores []string
	// Records are the sizes the store is measured at, filled in turn: the store grows
	// from one to the next, so the largest fill is the only one paid in full.
	Records []int
	// Shapes and ShapeRecords: the memory (or file size) per record of each shape,
	// each in a fresh store filled to each of these sizes; none without ShapeRecords.
	Shapes       []string
	ShapeRecords []int
	// Rounds is how many times a daemon is started on the filled store and measured.
	Rounds int
	// ToolRounds is how many of those rounds also time idemctl export and backup,
	// which read the whole store.
	ToolRounds int
	// Clients, Cycles and Duration are the load runs of each round, as Config's.
	Clients  []int
	Cycles   int
	Duration time.Duration
	// Dir holds the stores' files and the backups; default a temporary directory.
	// It is removed at the end.
	Dir string
	Out io.Writer
}

// The record shapes a store is filled with.
const (
	// ShapeSmall is a completed record with the load generator's result: status 201,
	// a Content-Type header and a 12-byte body.
	ShapeSmall = "small"
	// Shape1KiB is the same with a 1,024-byte body.
	Shape1KiB = "1kib"
	// ShapeLease is a pending record under a live lease, no result.
	ShapeLease = "lease"
)

// abandonedKeys are the keys left pending with an expired lease beside the records,
// which the abandoned-keys feed lists.
const abandonedKeys = 10

// sizeTenant is the tenant of an open daemon, which every record is filled in.
const sizeTenant = "default"

// deployment is one store measured at size: what serves it, and how to fill it and
// read its size.
type deployment struct {
	name    string
	masters []*proc.Process // the redis-servers, none for the embedded store
	dbPath  string          // the embedded store's file
	dir     string          // where its files go
}

func (d *deployment) storeURL() string {
	switch {
	case d.dbPath != "":
		return "bolt://" + d.dbPath
	case len(d.masters) > 1:
		return clusterURL(d.masters)
	}
	return "redis://" + d.masters[0].Addr + "/0"
}

// importer is what a fill needs of a store.
type importer interface {
	Import(ctx context.Context, e engine.Exported) (engine.ImportOutcome, error)
	Close() error
}

func (d *deployment) open() (importer, int, error) {
	if d.dbPath != "" {
		// Up to 1,000 transitions share a commit: as many in flight fill each one. The
		// fill does not wait for the disk, which the daemon's commits do.
		s, err := boltstore.Open(d.dbPath, boltstore.Options{NoSync: true})
		return s, 2000, err
	}
	s, err := redisstore.OpenWith(d.storeURL(), redisstore.Options{ClientName: "idemd-atsize-fill", Layout: redisstore.LayoutAuto, Pipelines: 8})
	return s, 1024, err
}

// record is the i-th record of a shape, as the record stream carries it.
func record(shape string, i int, now time.Time) engine.Exported {
	key := recordKey(shape, i)
	fp := sha256.Sum256([]byte(key))
	e := engine.Exported{KeyDigest: engine.KeyDigest(key)}
	e.ID = engine.ID{Tenant: sizeTenant, Key: key}
	e.Fingerprint, e.Attempt, e.LeaseToken = hex.EncodeToString(fp[:]), 1, engine.NewLeaseToken()
	e.CreatedAt, e.UpdatedAt, e.ExpiresAt = now, now, now.Add(7*24*time.Hour)
	headers := map[string][]string{"Content-Type": {"application/json"}}
	switch shape {
	case ShapeSmall:
		e.State, e.Response = engine.StateCompleted, &engine.Response{Status: 201, Headers: headers, Body: []byte(`{"order":42}`)}
	case Shape1KiB:
		e.State, e.Response = engine.StateCompleted, &engine.Response{Status: 201, Headers: headers, Body: bytes.Repeat([]byte{'x'}, 1024)}
	case ShapeLease:
		e.State, e.LeaseExpiresAt = engine.StatePending, now.Add(24*time.Hour)
	}
	return e
}

func recordKey(shape string, i int) string { return fmt.Sprintf("atsize-%s-%012d", shape, i) }

// fill imports records from to to-1 of a shape into d, many at once.
func (d *deployment) fill(ctx context.Context, shape string, from, to int) error {
	st, workers, err := d.open()
	if err != nil {
		return err
	}
	defer st.Close()
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	now := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				out, err := st.Import(ctx, record(shape, i, now))
				if err == nil && out != engine.ImportWritten {
					err = fmt.Errorf("record %d: %s, not written", i, out)
				}
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(firstErr, ctx.Err())
}

// bulkFill fills records from to to-1 of a shape into d as fast as the store allows,
// and checks that a Redis finds the last. The embedded store takes them in the
// order of their digests, tens of thousands a transaction, so that its file is
// written in order. Redis takes the first through the import script and a copy of it
// (DUMP, then RESTORE at each other record's key, in pipelines): the value of a record
// in the lean layout holds neither its key nor its tenant, so each copy is the record
// the script would have written, bar the usage counts, which count the first only. A
// pending record is in its tenant's pending index too, so a Redis takes the lease
// shape through the script.
func (d *deployment) bulkFill(ctx context.Context, shape string, from, to int) error {
	switch {
	case d.dbPath != "":
		// ImportBatch answers what it wrote of each record, and opening the store again to look
		// one up would read every record (see docs/bench-size.md, "What grows, and why").
		return d.batchFill(ctx, shape, from, to)
	case shape == ShapeLease:
		if err := d.fill(ctx, shape, from, to); err != nil {
			return err
		}
	default:
		if err := d.restoreFill(ctx, shape, from, to); err != nil {
			return err
		}
	}
	return d.check(ctx, record(shape, to-1, time.Now()).ID)
}

// check looks the record of id up through the store.
func (d *deployment) check(ctx context.Context, id engine.ID) error {
	st, _, err := d.open()
	if err != nil {
		return err
	}
	defer st.Close()
	r, err := st.(interface {
		Lookup(context.Context, engine.ID) (engine.Record, error)
	}).Lookup(ctx, id)
	if err != nil {
		return fmt.Errorf("looking %s up after the fill: %w", id.Key, err)
	}
	if r.State != engine.StateCompleted && r.State != engine.StatePending {
		return fmt.Errorf("%s is %s after the fill", id.Key, r.State)
	}
	return nil
}

// batchFill imports the records into the embedded store in the order of their
// digests, batchRecords a transaction.
func (d *deployment) batchFill(ctx context.Context, shape string, from, to int) error {
	const batchRecords = 50000
	st, err := boltstore.Open(d.dbPath, boltstore.Options{NoSync: true})
	if err != nil {
		return err
	}
	defer st.Close()
	type item struct {
		digest [32]byte
		i      int
	}
	items := make([]item, 0, to-from)
	for i := from; i < to; i++ {
		items = append(items, item{engine.KeyDigest(recordKey(shape, i)), i})
	}
	slices.SortFunc(items, func(a, b item) int { return bytes.Compare(a.digest[:], b.digest[:]) })
	now := time.Now()
	batch := make([]engine.Exported, 0, batchRecords)
	for k, it := range items {
		batch = append(batch, record(shape, it.i, now))
		if len(batch) < batchRecords && k < len(items)-1 {
			continue
		}
		for _, imp := range st.ImportBatch(ctx, batch) {
			if imp.Err != nil {
				return imp.Err
			}
			if imp.Outcome != engine.ImportWritten {
				return fmt.Errorf("a record of the fill was not written: %s", imp.Outcome)
			}
		}
		batch = batch[:0]
	}
	return nil
}

// restoreFill writes the first record through the import script and copies it to the
// keys of the others.
func (d *deployment) restoreFill(ctx context.Context, shape string, from, to int) error {
	if err := d.fill(ctx, shape, from, from+1); err != nil {
		return err
	}
	var client redis.UniversalClient
	if len(d.masters) > 1 {
		addrs := make([]string, len(d.masters))
		for i, m := range d.masters {
			addrs[i] = m.Addr
		}
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	} else {
		client = redis.NewClient(&redis.Options{Addr: d.masters[0].Addr})
	}
	defer client.Close()
	first := redisstore.LeanKey(record(shape, from, time.Now()).ID)
	dump, err := client.Dump(ctx, first).Result()
	if err != nil {
		return fmt.Errorf("DUMP of the first record: %w", err)
	}
	ttl, err := client.PTTL(ctx, first).Result()
	if err != nil || ttl <= 0 {
		return fmt.Errorf("PTTL of the first record: %v %v", ttl, err)
	}
	const pipeline = 1000
	var next atomic.Int64
	next.Store(int64(from + 1))
	errs := make([]error, 4*len(d.masters))
	var wg sync.WaitGroup
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				lo := int(next.Add(pipeline)) - pipeline
				if lo >= to {
					return
				}
				pipe := client.Pipeline()
				for i := lo; i < min(lo+pipeline, to); i++ {
					pipe.Restore(ctx, redisstore.LeanKey(engine.ID{Tenant: sizeTenant, Key: recordKey(shape, i)}), ttl, dump)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					errs[w] = fmt.Errorf("RESTORE: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

// addAbandoned imports the abandoned keys: pending, their leases run out a minute ago.
func (d *deployment) addAbandoned(ctx context.Context) error {
	st, _, err := d.open()
	if err != nil {
		return err
	}
	defer st.Close()
	now := time.Now()
	for i := range abandonedKeys {
		e := record(ShapeLease, i, now)
		e.ID.Key = fmt.Sprintf("atsize-abandoned-%02d", i)
		e.KeyDigest = engine.KeyDigest(e.ID.Key)
		e.LeaseExpiresAt = now.Add(-time.Minute)
		if _, err := st.Import(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// bytesHeld is Redis's used_memory summed over the masters, or the embedded store's
// file size.
func (d *deployment) bytesHeld(ctx context.Context) (int64, error) {
	if d.dbPath != "" {
		fi, err := os.Stat(d.dbPath)
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	var sum int64
	for _, m := range d.masters {
		v, err := infoField(ctx, m, "memory", "used_memory")
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

func infoField(ctx context.Context, p *proc.Process, section, field string) (int64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer rdb.Close()
	text, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.Name, err)
	}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s in INFO %s", p.Name, field, section)
}

// start starts what serves a deployment: nothing for the embedded store, its file
// in dir.
func (b *bench) startDeployment(ctx context.Context, name, dir string) (*deployment, error) {
	d := &deployment{name: name}
	switch name {
	case "embedded":
		d.dbPath = filepath.Join(dir, "idemd.db")
	case "redis":
		m, err := b.startRedis(ctx, "redis-server (at size)")
		if err != nil {
			return nil, err
		}
		d.masters = []*proc.Process{m}
	case "cluster":
		ms, err := b.startMasters(ctx, 3)
		if err != nil {
			return nil, err
		}
		d.masters = ms
	default:
		return nil, fmt.Errorf("unknown store %q: embedded, redis or cluster", name)
	}
	return d, nil
}

// sizeRound is what one daemon started on the filled store measured.
type sizeRound struct {
	startup     time.Duration
	startupCPU  time.Duration
	samples     []sample // one a number of clients
	overview    time.Duration
	feed        time.Duration
	feedKeys    int
	export      time.Duration
	exportBytes int64
	backup      time.Duration
	backupBytes int64
	load        string
}

// RunAtSize fills each store to each size in turn and, at each, measures what grows
// with the records: memory or file size per record, a daemon's start-up, claim latency
// and Redis's CPU per cycle, the console's overview, the abandoned-keys feed, and
// idemctl export and backup. It prints every round and a summary a size, and stops
// every process it started and removes every file it wrote.
func RunAtSize(ctx context.Context, cfg SizeConfig) error {
	if cfg.Rounds <= 0 || cfg.Cycles <= 0 || len(cfg.Clients) == 0 || len(cfg.Records) == 0 {
		return errors.New("rounds, cycles, clients and records must be given")
	}
	if !slices.IsSorted(cfg.Records) || cfg.Records[0] <= 0 {
		return errors.New("records must be positive and ascending")
	}
	if cfg.ModuleDir == "" {
		cfg.ModuleDir = "."
	}
	dir, err := os.MkdirTemp(cfg.Dir, "idemd-atsize-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{cfg: Config{ModuleDir: cfg.ModuleDir, Idemd: cfg.Idemd, RedisServer: cfg.RedisServer,
		Cycles: cfg.Cycles, Duration: cfg.Duration, Clients: cfg.Clients, Out: cfg.Out}, dir: dir, ps: &proc.Group{},
		// The embedded store reads every record when it opens.
		readyWithin: time.Hour}
	defer b.ps.Stop(stopGrace)
	if err := b.build(ctx); err != nil {
		return err
	}
	idemctl := filepath.Join(dir, "idemctl")
	build := exec.CommandContext(ctx, "go", "build", "-o", idemctl, "./cmd/idemctl")
	build.Dir = cfg.ModuleDir
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/idemctl: %v\n%s", err, out)
	}
	out := cfg.Out
	fmt.Fprintf(out, "%d cores, load average %s at the start; redis-server %s\n", runtime.NumCPU(), loadAverage(), redisVersion(cfg.RedisServer))
	if err := b.atSize(ctx, cfg, idemctl); err != nil {
		return err
	}
	if len(cfg.ShapeRecords) > 0 {
		for _, store := range cfg.Stores {
			for _, shape := range cfg.Shapes {
				if err := b.shape(ctx, cfg, store, shape); err != nil {
					return fmt.Errorf("%s, %s: %w", store, shape, err)
				}
			}
		}
	}
	fmt.Fprintf(out, "\nload average %s at the end\n", loadAverage())
	return nil
}

// shape measures the bytes per record of one shape in a fresh store of each size.
func (b *bench) shape(ctx context.Context, cfg SizeConfig, store, shape string) error {
	ps := b.ps
	b.ps = &proc.Group{}
	defer func() { b.ps.Stop(stopGrace); b.ps = ps }()
	dir, err := os.MkdirTemp(b.dir, store+"-"+shape+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d, err := b.startDeployment(ctx, store, dir)
	if err != nil {
		return err
	}
	base := int64(0)
	if d.dbPath == "" {
		if base, err = d.bytesHeld(ctx); err != nil {
			return err
		}
	}
	filled := 0
	for _, n := range cfg.ShapeRecords {
		start := time.Now()
		if err := d.bulkFill(ctx, shape, filled, n); err != nil {
			return err
		}
		rate := float64(n-filled) / time.Since(start).Seconds()
		filled = n
		held, err := d.bytesHeld(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(cfg.Out, "shape %s, %s, %d records: %.0f bytes a record (%d bytes held), filled at %.0f records/s, load average %s\n",
			shape, store, n, float64(held-base)/float64(n), held, rate, loadAverage())
	}
	return nil
}

// atSize fills every store to each size in turn, the stores at once, and measures
// each there, one after the other, so that no fill runs beside a measurement.
func (b *bench) atSize(ctx context.Context, cfg SizeConfig, idemctl string) error {
	out := cfg.Out
	ps := b.ps
	b.ps = &proc.Group{}
	defer func() { b.ps.Stop(stopGrace); b.ps = ps }()
	var ds []*deployment
	base := map[string]int64{}
	for _, store := range cfg.Stores {
		dir, err := os.MkdirTemp(b.dir, store+"-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		d, err := b.startDeployment(ctx, store, dir)
		if err != nil {
			return err
		}
		d.dir = dir
		if d.dbPath == "" {
			if base[store], err = d.bytesHeld(ctx); err != nil {
				return err
			}
		}
		ds = append(ds, d)
	}
	filled := 0
	for _, n := range cfg.Records {
		fmt.Fprintf(out, "\nfilling every store from %d to %d records at once (load average %s)\n", filled, n, loadAverage())
		errs := make([]error, len(ds))
		var wg sync.WaitGroup
		var outMu sync.Mutex // the fills print as they end
		for i, d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cpu0, _ := cpuOf(pids(d.masters))
				start := time.Now()
				if errs[i] = d.bulkFill(ctx, ShapeSmall, filled, n); errs[i] != nil {
					errs[i] = fmt.Errorf("%s, filling to %d: %w", d.name, n, errs[i])
					return
				}
				took := time.Since(start)
				cpu1, _ := cpuOf(pids(d.masters))
				var redisCPU time.Duration
				for j := range cpu1 {
					redisCPU += cpu1[j] - cpu0[j]
				}
				if filled == 0 {
					if errs[i] = d.addAbandoned(ctx); errs[i] != nil {
						return
					}
				}
				outMu.Lock()
				defer outMu.Unlock()
				fmt.Fprintf(out, "%s: %d new records in %s, %.0f records/s, Redis %.1f µs a record (load average %s)\n",
					d.name, n-filled, took.Round(time.Second), float64(n-filled)/took.Seconds(), perCycle(redisCPU, n-filled), loadAverage())
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		filled = n
		// The rounds that read the whole store (export, backup) come after every
		// store's others, which take minutes rather than hours at the largest sizes.
		for _, tools := range []bool{false, true} {
			for _, d := range ds {
				held, err := d.bytesHeld(ctx)
				if err != nil {
					return err
				}
				held -= base[d.name]
				if !tools {
					fmt.Fprintf(out, "\n%s, %d records: %d bytes held, %.0f bytes a record; load average %s\n",
						d.name, n, held, float64(held)/float64(n+abandonedKeys), loadAverage())
				}
				var rounds []sizeRound
				for round := 1; round <= cfg.Rounds; round++ {
					if tools && round > cfg.ToolRounds {
						break
					}
					r, err := b.sizeRound(ctx, d, d.dir, idemctl, round, tools)
					if err != nil {
						return fmt.Errorf("%s, %d records, round %d: %w", d.name, n, round, err)
					}
					printSizeRound(out, round, r)
					rounds = append(rounds, r)
				}
				if len(rounds) > 0 {
					printSizeSummary(out, d.name, n, held, rounds)
				}
			}
		}
	}
	return nil
}

func pids(ps []*proc.Process) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID()
	}
	return out
}

// sizeRound starts a daemon on d and measures it, then stops it.
func (b *bench) sizeRound(ctx context.Context, d *deployment, dir, idemctl string, round int, tools bool) (sizeRound, error) {
	var r sizeRound
	r.load = loadAverage()
	start := time.Now()
	daemon, err := b.startIdemd(ctx, "idemd (at size)", "--store", d.storeURL(), "--console")
	if err != nil {
		return r, err
	}
	defer daemon.Stop(syscall.SIGTERM, stopGrace)
	r.startup = time.Since(start)
	// On a loaded machine a start-up waits for a core; its CPU is what it did.
	if r.startupCPU, err = proc.CPU(daemon.PID()); err != nil {
		return r, err
	}
	base := "http://" + daemon.Addr
	t := &target{name: d.name, title: "idemd, " + d.name, urls: []string{base}, servers: []*proc.Process{daemon}, redis: d.masters}
	if err := b.warm(ctx, t); err != nil {
		return r, err
	}
	for _, c := range b.cfg.Clients {
		s, err := b.measure(ctx, t, c, fmt.Sprintf("atsize-r%d-c%d-%d", round, c, time.Now().UnixNano()), false)
		if err != nil {
			return r, err
		}
		r.samples = append(r.samples, s)
	}
	client := &http.Client{Timeout: time.Minute}
	if r.overview, err = median(5, func() error { return get(ctx, client, base+"/console/api/overview", nil) }); err != nil {
		return r, fmt.Errorf("overview: %w", err)
	}
	// The first pass after a start sweeps the due index; the passes timed come after.
	if _, err := feedPass(ctx, client, base); err != nil {
		return r, err
	}
	if r.feed, err = median(5, func() error {
		n, err := feedPass(ctx, client, base)
		r.feedKeys = n
		return err
	}); err != nil {
		return r, err
	}
	if !tools {
		return r, nil
	}
	var count countWriter
	start = time.Now()
	if err := runTool(ctx, &count, idemctl, "--url", base, "--timeout", "2h", "export", "--out", "-"); err != nil {
		return r, err
	}
	r.export, r.exportBytes = time.Since(start), count.n
	if d.dbPath != "" {
		file := filepath.Join(dir, "backup.db")
		start = time.Now()
		if err := runTool(ctx, io.Discard, idemctl, "--url", base, "--timeout", "2h", "backup", "--out", file); err != nil {
			return r, err
		}
		r.backup = time.Since(start)
		if fi, err := os.Stat(file); err == nil {
			r.backupBytes = fi.Size()
		}
		_ = os.Remove(file)
		_ = os.Remove(file + ".sha256")
	}
	return r, nil
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func runTool(ctx context.Context, stdout io.Writer, argv ...string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(argv[3:], " "), err, stderr.String())
	}
	return nil
}

// median runs fn n times and returns the median of the times it took.
func median(n int, fn func() error) (time.Duration, error) {
	took := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := fn(); err != nil {
			return 0, err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

func get(ctx context.Context, client *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if out != nil {
		return json.Unmarshal(body, out)
	}
	return nil
}

// feedPass reads the whole abandoned-keys feed, page by page, and returns the keys
// it listed.
func feedPass(ctx context.Context, client *http.Client, base string) (int, error) {
	cursor, n := "", 0
	for page := 0; page < 1000; page++ {
		u := base + "/v1/abandoned?limit=100"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		var p struct {
			Keys       []json.RawMessage `json:"keys"`
			NextCursor string            `json:"next_cursor"`
		}
		if err := get(ctx, client, u, &p); err != nil {
			return n, fmt.Errorf("abandoned-keys feed: %w", err)
		}
		n += len(p.Keys)
		if p.NextCursor == "" {
			return n, nil
		}
		cursor = p.NextCursor
	}
	return n, errors.New("abandoned-keys feed: more than 1,000 pages")
}

func printSizeRound(out io.Writer, round int, r sizeRound) {
	fmt.Fprintf(out, "  round %d (load average %s): start-up %s (CPU %s)", round, r.load, r.startup.Round(time.Millisecond), r.startupCPU)
	for _, s := range r.samples {
		fmt.Fprintf(out, "; %d clients %.0f cycles/s claim p50 %s p99 %s, Redis %.1f µs/cycle, idemd %.1f µs/cycle",
			s.clients, s.rate(), s.claimP50.Round(time.Microsecond), s.claimP99.Round(time.Microsecond),
			perCycle(s.redis, s.cycles), perCycle(s.server, s.cycles))
		if s.errors > 0 {
			fmt.Fprintf(out, " (%d errors: %s)", s.errors, s.firstErr)
		}
	}
	fmt.Fprintf(out, "; overview %s; feed pass %s (%d keys)", r.overview.Round(10*time.Microsecond), r.feed.Round(10*time.Microsecond), r.feedKeys)
	if r.export > 0 {
		fmt.Fprintf(out, "; export %s (%d bytes)", r.export.Round(time.Millisecond), r.exportBytes)
	}
	if r.backup > 0 {
		fmt.Fprintf(out, "; backup %s (%d bytes)", r.backup.Round(time.Millisecond), r.backupBytes)
	}
	fmt.Fprintln(out)
}

func perCycle(d time.Duration, cycles int) float64 {
	return float64(d.Microseconds()) / float64(max(cycles, 1))
}

// spread is "lo – hi" of what the rounds measured.
func spread[T any](rounds []sizeRound, f func(sizeRound) (T, bool), show func(T) string, less func(a, b T) bool) string {
	var vs []T
	for _, r := range rounds {
		if v, ok := f(r); ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return "–"
	}
	slices.SortFunc(vs, func(a, b T) int {
		if less(a, b) {
			return -1
		}
		if less(b, a) {
			return 1
		}
		return 0
	})
	lo, hi := show(vs[0]), show(vs[len(vs)-1])
	if lo == hi {
		return lo
	}
	return lo + " – " + hi
}

func durations(rounds []sizeRound, f func(sizeRound) time.Duration, unit time.Duration) string {
	return spread(rounds, func(r sizeRound) (time.Duration, bool) { v := f(r); return v, v > 0 },
		func(d time.Duration) string { return d.Round(unit).String() }, func(a, b time.Duration) bool { return a < b })
}

func floats(rounds []sizeRound, f func(sizeRound) float64) string {
	return spread(rounds, func(r sizeRound) (float64, bool) { return f(r), true },
		func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }, func(a, b float64) bool { return a < b })
}

func printSizeSummary(out io.Writer, store string, n int, held int64, rounds []sizeRound) {
	loads := spread(rounds, func(r sizeRound) (float64, bool) { v, err := strconv.ParseFloat(r.load, 64); return v, err == nil },
		func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }, func(a, b float64) bool { return a < b })
	fmt.Fprintf(out, "summary %s at %d records (%d rounds, load average %s): %.0f bytes a record; start-up %s (CPU %s)",
		store, n, len(rounds), loads, float64(held)/float64(n+abandonedKeys), durations(rounds, func(r sizeRound) time.Duration { return r.startup }, time.Millisecond),
		durations(rounds, func(r sizeRound) time.Duration { return r.startupCPU }, 10*time.Millisecond))
	for i := range rounds[0].samples {
		c := rounds[0].samples[i].clients
		fmt.Fprintf(out, "; %d clients: claim p50 %s, p99 %s, Redis µs/cycle %s", c,
			durations(rounds, func(r sizeRound) time.Duration { return r.samples[i].claimP50 }, time.Microsecond),
			durations(rounds, func(r sizeRound) time.Duration { return r.samples[i].claimP99 }, time.Microsecond),
			floats(rounds, func(r sizeRound) float64 { return perCycle(r.samples[i].redis, r.samples[i].cycles) }))
	}
	fmt.Fprintf(out, "; overview %s; feed pass %s; export %s; backup %s\n",
		durations(rounds, func(r sizeRound) time.Duration { return r.overview }, 10*time.Microsecond),
		durations(rounds, func(r sizeRound) time.Duration { return r.feed }, 10*time.Microsecond),
		durations(rounds, func(r sizeRound) time.Duration { return r.export }, time.Millisecond),
		durations(rounds, func(r sizeRound) time.Duration { return r.backup }, time.Millisecond))
}
