// Command idemd-blobbench measures idemd with large results on loopback: with -mode
// rss, the daemon's resident memory (idle, and its peak, VmHWM) while 32 clients
// complete results of 16 MiB at once through raw PUTs and then replay them at once
// through raw GETs, for each idemd binary given, so that two builds compare in one
// run; with -mode replay, the replay's throughput and latency at each size, inline and
// by reference, over several rounds. Each runs over the embedded store with a blob
// directory (dir) and over Redis with SeaweedFS's S3 gateway (s3). docs/bench-blobs.md
// shows its output.
//
//	go run ./cmd/idemd-blobbench -mode rss -idemd before=/tmp/idemd-base,after=/tmp/idemd
//	go run ./cmd/idemd-blobbench -mode replay -idemd after=/tmp/idemd
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/idemd/idemd/internal/loadtest/blobbench"
)

func main() {
	cfg := blobbench.Config{Out: os.Stdout}
	home, _ := os.UserHomeDir()
	mode := flag.String("mode", "rss", "rss: the daemon's memory under large completions and replays; replay: the replay's throughput and latency")
	daemons := flag.String("idemd", "", "idemd binaries to measure, label=path, comma-separated (required)")
	stores := flag.String("stores", "dir,s3", "dir: the embedded store and a blob directory; s3: Redis and SeaweedFS's S3 gateway")
	flag.StringVar(&cfg.RedisServer, "redis-server", "redis-server", "redis-server binary")
	flag.StringVar(&cfg.Weed, "weed", filepath.Join(home, ".cache/idemd-ci/bin/weed"), "SeaweedFS's weed binary")
	flag.IntVar(&cfg.Clients, "clients", 32, "rss: concurrent completions, then concurrent replays")
	size := flag.Int64("size", 16<<20, "rss: bytes of each result")
	sizes := flag.String("sizes", "65536,1048576,16777216", "replay: result sizes, bytes, comma-separated")
	flag.IntVar(&cfg.Replays, "replays", 64, "replay: raw GETs per size and round")
	flag.IntVar(&cfg.ReplayClients, "replay-clients", 4, "replay: concurrent clients")
	flag.IntVar(&cfg.Keys, "keys", 8, "replay: results completed per size and round, which the replays read in turn")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "replay: rounds per size")
	flag.Parse()
	cfg.Size = *size
	cfg.Stores = strings.Split(*stores, ",")
	for _, d := range strings.Split(*daemons, ",") {
		label, path, ok := strings.Cut(d, "=")
		if !ok || path == "" {
			fmt.Fprintln(os.Stderr, "idemd-blobbench: -idemd takes label=path, comma-separated")
			os.Exit(2)
		}
		cfg.Daemons = append(cfg.Daemons, blobbench.Daemon{Label: label, Path: path})
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			fmt.Fprintln(os.Stderr, "idemd-blobbench: -sizes takes byte counts, comma-separated")
			os.Exit(2)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := blobbench.Run(ctx, cfg, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "idemd-blobbench:", err)
		os.Exit(1)
	}
}
