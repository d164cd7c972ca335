package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// BenchmarkUsageIdle measures what one idle daemon costs Redis for a tenant of many
// records with a quota, against one without: a fresh store reads the store's fill every
// half second (the store guard) in both, and, for the tenant with a quota, its usage
// every engine.DefaultUsageRefresh, as a daemon does while it serves that tenant. The
// tenant's records are written first through the store, their retentions spread over
// 24 h (a minute to a day). Each size alternates windows without and with the quota,
// IDEMD_BENCH_USAGE_ROUNDS times (2 by default), of IDEMD_BENCH_USAGE_WINDOW each (10 s
// by default), and reports Redis's commands a second (INFO commandstats, the calls inside
// scripts included, INFO itself left out) and Redis's CPU a second (INFO cpu, user and
// system), summed over every node, replicas included:
//
//	go test -run '^$' -bench UsageIdle -benchtime 1x -timeout 60m ./internal/engine/redisstore/
//
// IDEMD_BENCH_USAGE_RECORDS lists the sizes (10000,100000 by default; 1000000 takes a few
// minutes to write on a small machine), IDEMD_BENCH_USAGE_DEPLOYMENTS the deployments
// (standalone,cluster).
func BenchmarkUsageIdle(b *testing.B) {
	sizes := []int{10_000, 100_000}
	if v := os.Getenv("IDEMD_BENCH_USAGE_RECORDS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("IDEMD_BENCH_USAGE_RECORDS: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	deployments := []string{"standalone", "cluster"}
	if v := os.Getenv("IDEMD_BENCH_USAGE_DEPLOYMENTS"); v != "" {
		deployments = strings.Split(v, ",")
	}
	window := 10 * time.Second
	if v := os.Getenv("IDEMD_BENCH_USAGE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("IDEMD_BENCH_USAGE_WINDOW: %v", err)
		}
		window = d
	}
	rounds := 2
	if v := os.Getenv("IDEMD_BENCH_USAGE_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("IDEMD_BENCH_USAGE_ROUNDS: %v", err)
		}
		rounds = n
	}
	parent := b
	for _, deployment := range deployments {
		var url string
		var nodes []string
		tenant := fmt.Sprintf("idle-%d", time.Now().UnixNano())
		written := 0
		for _, size := range sizes {
			b.Run(fmt.Sprintf("%s/%d_records", deployment, size), func(b *testing.B) {
				if url == "" {
					if deployment == "cluster" {
						c := testredis.StartCluster(parent)
						url = c.URL()
						for _, n := range c.Nodes {
							nodes = append(nodes, n.Addr())
						}
					} else {
						srv := testredis.Start(parent)
						url, nodes = srv.URL(), []string{srv.Addr()}
					}
				}
				start := time.Now()
				written = fillSpread(b, url, tenant, written, size)
				b.Logf("%d records written in %v", written, time.Since(start).Round(time.Second))
				for b.Loop() {
					idleWindows(b, url, nodes, tenant, window, rounds)
				}
			})
		}
	}
}

// fillSpread writes records of tenant from the from-th up to the to-th, their
// retentions spread over a day, and answers to.
func fillSpread(b *testing.B, url, tenant string, from, to int) int {
	s, err := redisstore.OpenWith(url, redisstore.Options{LeanRecords: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(to) {
					return
				}
				c := engine.Claim{ID: engine.ID{Tenant: tenant, Key: fmt.Sprintf("order-%d", i)}, Lease: 30 * time.Second,
					Retention: time.Duration(i%1440+1) * time.Minute, Token: engine.NewLeaseToken()}
				if _, err := s.Claim(ctx, c); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return to
}

// redisLoad is what Redis's nodes have done: commands and CPU seconds, summed.
type redisLoad struct {
	commands float64
	cpu      float64
}

func measureRedis(b *testing.B, ctx context.Context, clients []*redis.Client) redisLoad {
	var l redisLoad
	for _, c := range clients {
		stats, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(stats) {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok || name == "cmdstat_info" {
				continue
			}
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			l.commands += float64(n)
		}
		cpu, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(cpu) {
			for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
					x, _ := strconv.ParseFloat(v, 64)
					l.cpu += x
				}
			}
		}
	}
	return l
}

// idleWindows runs rounds of a window without the quota and one with it, each on a
// fresh store as a daemon just started, and reports both and their ratio.
func idleWindows(b *testing.B, url string, nodes []string, tenant string, window time.Duration, rounds int) {
	ctx := context.Background()
	var clients []*redis.Client
	for _, addr := range nodes {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		clients = append(clients, c)
	}
	var sums [2]redisLoad
	var reads int
	var readTime time.Duration
	for range rounds {
		for quota := range 2 {
			s, err := redisstore.OpenWith(url, redisstore.Options{LeanRecords: true})
			if err != nil {
				b.Fatal(err)
			}
			// The first calls learn the deployment and load the scripts.
			if _, err := s.Fill(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Usage(ctx, "nobody"); err != nil {
				b.Fatal(err)
			}
			before := measureRedis(b, ctx, clients)
			began := time.Now()
			fill := time.NewTicker(500 * time.Millisecond)
			usage := time.NewTicker(engine.DefaultUsageRefresh)
			readUsage := func() {
				t0 := time.Now()
				if _, err := s.Usage(ctx, tenant); err != nil {
					b.Fatal(err)
				}
				reads++
				readTime += time.Since(t0)
			}
			if quota == 1 {
				readUsage()
			}
			for end := time.After(window); ; {
				select {
				case <-fill.C:
					if _, err := s.Fill(ctx); err != nil {
						b.Fatal(err)
					}
					continue
				case <-usage.C:
					if quota == 1 {
						readUsage()
					}
					continue
				case <-end:
				}
				break
			}
			fill.Stop()
			usage.Stop()
			after := measureRedis(b, ctx, clients)
			secs := time.Since(began).Seconds()
			sums[quota].commands += (after.commands - before.commands) / secs
			sums[quota].cpu += (after.cpu - before.cpu) / secs
			_ = s.Close()
		}
	}
	r := float64(rounds)
	b.ReportMetric(sums[0].commands/r, "cmds/s-noquota")
	b.ReportMetric(sums[1].commands/r, "cmds/s-quota")
	b.ReportMetric(sums[0].cpu/r*1e6, "cpu-µs/s-noquota")
	b.ReportMetric(sums[1].cpu/r*1e6, "cpu-µs/s-quota")
	b.ReportMetric(sums[1].cpu/sums[0].cpu, "cpu-ratio")
	if reads > 0 {
		b.ReportMetric(float64(readTime.Microseconds())/float64(reads)/1000, "ms/read")
	}
}
