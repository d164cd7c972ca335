// Command idemd-load sends claim+complete cycles on fresh keys to an idemd and prints
// the throughput and latency it measured. Point it only at a daemon you run.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/idemd/idemd/internal/loadgen"
)

func main() {
	cfg := loadgen.Config{}
	flag.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:8080", "idemd base URL")
	flag.IntVar(&cfg.Clients, "clients", 32, "concurrent clients")
	flag.IntVar(&cfg.Cycles, "cycles", 100000, "claim+complete cycles in all")
	flag.DurationVar(&cfg.Duration, "duration", time.Minute, "stop after this long even if cycles remain")
	token := flag.String("token", "", "bearer token to send")
	flag.Parse()
	cfg.KeyPrefix = fmt.Sprintf("load-%d", time.Now().UnixNano())
	if *token != "" {
		cfg.Header = http.Header{"Authorization": {"Bearer " + *token}}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := loadgen.Run(ctx, cfg)
	fmt.Println(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
