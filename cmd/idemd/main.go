// Command idemd is the idempotency daemon. It only wires: flags, logging, the store, the
// HTTP server and signals; the behaviour lives in internal/server and internal/engine.
//
// `idemd healthcheck [--url URL]` asks a running daemon's /healthz and exits 0 when it
// answers 200; container images without a shell use it as their health check.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemd/idemd/internal/engine/redisstore"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	m := NewMain()
	if err := m.ParseFlags(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "idemd:", err)
		os.Exit(2)
	}
	if m.ShowVersion {
		fmt.Println(buildOf())
		return
	}
	// Process-wide, so set once here rather than by each Run.
	redisstore.SetLogger(m.Logger)
	tracer, err := tracing(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemd:", err)
		os.Exit(2)
	}
	if tracer != nil {
		m.Tracing = tracer
		m.Logger.Info("tracing requests to OTLP")
	}
	err = m.Run(ctx)
	if tracer != nil {
		// Send the spans still batched, within a bound of their own.
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if ferr := tracer.Shutdown(flush); ferr != nil {
			m.Logger.Warn("sending the last spans", "err", ferr)
		}
		cancel()
	}
	if err != nil {
		m.Logger.Error("idemd stopped", "err", m.env.explain(err))
		os.Exit(1)
	}
}

func healthcheck(args []string) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080/healthz", "health endpoint to ask")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "healthcheck:", resp.Status)
		return 1
	}
	return 0
}
