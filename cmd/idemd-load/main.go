// Command idemd-load sends claim+complete cycles on fresh keys to an idemd and prints
// the throughput and latency it measured, and the CPU it spent itself. Point it only
// at a daemon you run.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/loadtest/loadgen"
)

func main() {
	cfg := loadgen.Config{}
	urls := flag.String("url", "http://127.0.0.1:8080", "idemd base URL; several, comma-separated, share the clients out among them")
	flag.IntVar(&cfg.Clients, "clients", 32, "concurrent clients")
	flag.IntVar(&cfg.Cycles, "cycles", 100000, "claim+complete cycles in all")
	flag.DurationVar(&cfg.Duration, "duration", time.Minute, "stop after this long even if cycles remain")
	flag.StringVar(&cfg.KeyPrefix, "key-prefix", fmt.Sprintf("load-%d", time.Now().UnixNano()), "prefix of the keys, unique to the run")
	token := flag.String("token", "", "bearer token to send")
	asJSON := flag.Bool("json", false, "print the result as one JSON object (durations in nanoseconds), for other programs")
	flag.Parse()
	if list := strings.Split(*urls, ","); len(list) > 1 {
		cfg.BaseURLs = list
	} else {
		cfg.BaseURL = *urls
	}
	if *token != "" {
		cfg.Header = http.Header{"Authorization": {"Bearer " + *token}}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := loadgen.Run(ctx, cfg)
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(res)
	} else {
		fmt.Printf("%s; the generator's CPU %.0f µs per cycle\n", res, float64(res.CPU.Microseconds())/float64(max(res.Cycles, 1)))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
