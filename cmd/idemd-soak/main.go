// Command idemd-soak runs idemd over its own Redis for a long time under load and
// faults, prints a row per sample, and fails when an acknowledged completion is lost
// or a resource grows without levelling off. It starts and stops every process it
// uses, on loopback; see the Soak section of docs/failures.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemd/idemd/internal/loadtest/soak"
)

func main() {
	cfg := soak.Defaults()
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the soak runs; it stops by itself then")
	flag.DurationVar(&cfg.Sample, "sample", cfg.Sample, "interval between samples (at least 6 in the duration)")
	flag.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients")
	flag.Float64Var(&cfg.Rate, "rate", cfg.Rate, "operations a second, all clients together")
	flag.DurationVar(&cfg.Retention, "retention", cfg.Retention, "idemd's --retention, which most completions keep")
	flag.DurationVar(&cfg.KeepFirst, "keep-first", cfg.KeepFirst, "completions in this first stretch are kept past the end of the run and checked at every sample")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", cfg.FaultEvery, "interval between faults, in turn: link dropped, Redis SIGTERM restart, link stalled, Redis SIGKILL restart; 0 for none")
	flag.DurationVar(&cfg.CutFor, "cut-for", cfg.CutFor, "how long a link cut lasts")
	flag.StringVar(&cfg.Idemd, "idemd", "", "idemd binary to run; default: go build ./cmd/idemd of the module in the working directory")
	flag.StringVar(&cfg.RedisServer, "redis-server", "", "redis-server binary; default: the one on the PATH")
	flag.StringVar(&cfg.Dir, "dir", "", "directory for Redis's data and the logs; default: a temporary one, kept only when the soak fails")
	flag.BoolVar(&cfg.JSON, "json", false, "print a JSON object per line (samples, faults, the verdict) instead of the table")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: idemd-soak [flags]

Runs redis-server (appendonly, appendfsync always) and idemd over it through a relay
that can cut the link, drives claims, completions, replays, fingerprint mismatches,
waiters that hang up, leases taken over, purges, recovery points and the abandoned-keys
feed, injects faults, and prints a row per sample.

It exits 1 when an acknowledged completion is lost (a lookup or a replay within its
retention finds it gone or changed) or a measure does not level off, and 2 when it
could not run (no redis-server, idemd did not build or start):

%s

Flags:
`, soak.LevellingRule)
		flag.PrintDefaults()
	}
	flag.Parse()
	cfg.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, cfg)
	if rep.Dir != "" {
		fmt.Fprintf(os.Stderr, "logs and data kept in %s\n", rep.Dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if rep.Failed() {
		os.Exit(1)
	}
}
