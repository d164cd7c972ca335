// Command idemd-floorbench measures idemd against the floor (../shared/bench/floor), the
// least an HTTP service that decodes the same JSON and runs one script per request can
// cost here: it builds both, starts the floor, idemd over Redis and idemd over the
// embedded store on loopback, and runs idemd-load in a process of its own against each
// in turn, for several rounds, printing cycles/s, claim latency and every process's
// CPU per cycle. With -masters it measures idemd over Redis Clusters of that many
// masters instead, the CPU each master and each daemon spends per cycle.
// docs/benchmarks.md shows its output. With -records it measures the stores at size
// instead (docs/bench-size.md): it fills each store to each number of records and
// measures there what may grow with them.
//
//	go run ./cmd/idemd-floorbench                  # from the repository's root
//	go run ./cmd/idemd-floorbench -masters 1,2,3
//	go run ./cmd/idemd-floorbench -records 1000000,10000000 -stores embedded,redis,cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemd/idemd/internal/loadtest/floorbench"
)

func main() {
	cfg := floorbench.Config{Out: os.Stdout}
	flag.StringVar(&cfg.FloorDir, "floor", "../shared/bench/floor", "the floor's source directory")
	flag.StringVar(&cfg.Idemd, "idemd", "", "idemd binary (default: build ./cmd/idemd)")
	flag.StringVar(&cfg.RedisServer, "redis-server", "redis-server", "redis-server binary")
	targets := flag.String("targets", "floor,redis,embedded", "what to measure (floor, redis: idemd over Redis, embedded: idemd over its embedded store); the others are compared with the first")
	clients := flag.String("clients", "1,4,32", "numbers of concurrent clients, comma-separated (with -masters, the largest)")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "times to run every target at every number of clients, in an order that turns each round")
	flag.IntVar(&cfg.Cycles, "cycles", 20000, "claim+complete cycles of each run")
	flag.DurationVar(&cfg.Duration, "duration", 30*time.Second, "stop a run after this long even if cycles remain")
	masters := flag.String("masters", "", "measure Redis Clusters of these many masters instead (e.g. 1,2,3)")
	flag.IntVar(&cfg.Daemons, "daemons", 0, "with -masters: idemd daemons per cluster (default one per master)")
	flag.BoolVar(&cfg.ClientsPerMaster, "clients-per-master", false, "with -masters: run N masters with N times the clients and cycles, the same load on each master")
	flag.StringVar(&cfg.Perf, "perf", "", "directory where perf record profiles every server during the first round at the most clients")
	records := flag.String("records", "", "measure the stores at size instead: fill each to these numbers of records in turn (e.g. 1000000,10000000)")
	stores := flag.String("stores", "embedded,redis,cluster", "with -records: the stores (embedded, redis: one Redis, cluster: a 3-master Redis Cluster)")
	shapeRecords := flag.String("shape-records", "", "with -records: also measure the bytes a record of each -shapes takes, in a fresh store filled to these numbers")
	shapes := flag.String("shapes", "small,1kib,lease", "with -shape-records: the record shapes (small: a 12-byte result, 1kib: a 1,024-byte result, lease: pending, no result)")
	toolRounds := flag.Int("tool-rounds", 1, "with -records: the rounds that also time idemctl export and backup, which read the whole store")
	dir := flag.String("dir", "", "with -records: where the stores' files go (default the system's temporary directory); removed at the end")
	flag.Parse()
	if *records != "" {
		os.Exit(atSize(cfg, *records, *stores, *shapeRecords, *shapes, *clients, *toolRounds, *dir))
	}
	var err error
	cfg.Targets = strings.Split(*targets, ",")
	if cfg.Clients, err = ints(*clients); err == nil && *masters != "" {
		cfg.Masters, err = ints(*masters)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemd-floorbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := floorbench.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "idemd-floorbench:", err)
		os.Exit(1)
	}
}

func ints(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a list of numbers", list)
		}
		out = append(out, n)
	}
	return out, nil
}

func atSize(floor floorbench.Config, records, stores, shapeRecords, shapes, clients string, toolRounds int, dir string) int {
	cfg := floorbench.SizeConfig{Idemd: floor.Idemd, RedisServer: floor.RedisServer, Stores: strings.Split(stores, ","),
		Shapes: strings.Split(shapes, ","), Rounds: floor.Rounds, ToolRounds: toolRounds, Cycles: floor.Cycles,
		Duration: floor.Duration, Dir: dir, Out: os.Stdout}
	var err error
	if cfg.Records, err = ints(records); err == nil {
		cfg.Clients, err = ints(clients)
	}
	if err == nil && shapeRecords != "" {
		cfg.ShapeRecords, err = ints(shapeRecords)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemd-floorbench:", err)
		return 2
	}
	// A fill runs for many minutes: SIGTERM, too, stops every process it started and
	// removes the stores' files.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := floorbench.RunAtSize(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "idemd-floorbench:", err)
		return 1
	}
	return 0
}
