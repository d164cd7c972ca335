// Command idemd-appbench measures what idempotency costs a Go service, in one run:
// the same net/http handler (a) bare, (b) behind a middleware that talks to Redis
// itself, (c) behind idem.Middleware and idemd over Redis, (d) the same over the
// embedded store, and (c0) as (c) with the SDK's former settings. It starts redis-server, two idemd daemons and one app process per
// configuration on loopback ports, sends first requests and then their replays, and
// prints requests per second, latency and the CPU each process spent per request.
// docs/benchmarks.md shows its output.
//
//	go run ./cmd/idemd-appbench                 # from the repository's root
//
// `idemd-appbench app -mode ...` is one app process; the bench starts those itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/loadtest/appbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "app" {
		var cfg appbench.AppConfig
		fs := flag.NewFlagSet("app", flag.ExitOnError)
		fs.StringVar(&cfg.Mode, "mode", appbench.ModeBare, "bare, direct or idemd")
		fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "address to serve on")
		fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL (direct)")
		fs.StringVar(&cfg.IdemdURL, "idemd", "", "idemd URL (idemd)")
		cache := fs.Bool("sdk-replay-cache", true, "keep the SDK's replay cache on (idemd)")
		plainHTTP := fs.Bool("sdk-plain-http-client", false, "give the SDK a bare &http.Client{}, 2 idle connections per host (idemd)")
		batching := fs.Bool("sdk-batching", true, "let the SDK gather concurrent calls into batches (idemd)")
		cpuProfile := fs.String("cpuprofile", "", "write the app's CPU profile to this file")
		memProfile := fs.String("memprofile", "", "write the app's allocation profile to this file when it stops")
		_ = fs.Parse(os.Args[2:])
		if *cpuProfile != "" {
			f, err := os.Create(*cpuProfile)
			if err != nil {
				fmt.Fprintln(os.Stderr, "app:", err)
				os.Exit(1)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				fmt.Fprintln(os.Stderr, "app:", err)
				os.Exit(1)
			}
			defer pprof.StopCPUProfile()
		}
		if *memProfile != "" {
			defer writeAllocs(*memProfile)
		}
		if !*cache {
			cfg.SDKOptions = append(cfg.SDKOptions, idem.WithReplayCache(0, 0))
		}
		if !*batching {
			cfg.SDKOptions = append(cfg.SDKOptions, idem.WithBatching(false))
		}
		if *plainHTTP {
			cfg.SDKOptions = append(cfg.SDKOptions, idem.WithHTTPClient(&http.Client{}))
		}
		if err := appbench.ServeApp(ctx, cfg); err != nil {
			fmt.Fprintln(os.Stderr, "app:", err)
			os.Exit(1)
		}
		return
	}

	cfg := appbench.Config{Out: os.Stdout}
	flag.IntVar(&cfg.Clients, "clients", 50, "concurrent clients")
	flag.IntVar(&cfg.Requests, "requests", 20000, "requests per phase (first requests, then as many replays)")
	flag.DurationVar(&cfg.MaxPhase, "max-phase", time.Minute, "stop a phase after this long")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "times to run every configuration")
	configs := flag.String("configs", "a,b,c,d,c1,c0", "configurations to run (c1: (c) without batching; c0: (c) with the SDK's first settings)")
	flag.StringVar(&cfg.Idemd, "idemd", "", "idemd binary (default: build ./cmd/idemd)")
	flag.StringVar(&cfg.RedisServer, "redis-server", "redis-server", "redis-server binary")
	flag.StringVar(&cfg.ServerCPUs, "server-cpus", "", "run redis-server and idemd on these CPUs (taskset list), apart from the apps and the load generator; run the bench itself under taskset -c on the others")
	appFlags := flag.String("app-flags", "", "flags for every app process, space-separated (e.g. -sdk-replay-cache=false); {config} in a flag becomes the configuration's name (-cpuprofile /tmp/app-{config}.prof)")
	flag.Parse()
	cfg.AppFlags = strings.Fields(*appFlags)
	cfg.Configs = strings.Split(*configs, ",")
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg.AppCommand = []string{self, "app"}
	if err := appbench.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "idemd-appbench:", err)
		os.Exit(1)
	}
}

// writeAllocs writes the heap profile, whose alloc_space and alloc_objects samples
// count every allocation since the app started.
func writeAllocs(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
	}
}
