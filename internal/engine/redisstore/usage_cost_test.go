package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// commandCounter is a go-redis hook that counts the commands a client sends, by name,
// alone or in pipelines.
type commandCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *commandCounter) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		c.counts[cmd.Name()]++
	}
}

// take returns the counts since the last take, and starts again.
func (c *commandCounter) take() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	counts, total := c.counts, 0
	for _, n := range counts {
		total += n
	}
	c.counts = map[string]int{}
	return counts, total
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.add(cmds...)
		return next(ctx, cmds)
	}
}

// countedStore is a store over url whose commands counter counts.
func countedStore(t testing.TB, url string) (*redisstore.Store, *commandCounter) {
	t.Helper()
	universal, err := redisstore.NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	counter := &commandCounter{counts: map[string]int{}}
	universal.AddHook(counter)
	client, err := redisstore.Adapt(universal)
	if err != nil {
		t.Fatal(err)
	}
	s := redisstore.New(client, redisstore.Options{LeanRecords: true})
	t.Cleanup(func() { _ = s.Close() })
	return s, counter
}

// TestUsageReadCost counts the commands one read of a tenant's usage sends: a constant
// few, whatever the tenant keeps and wherever (one script on its totals, and on a
// Cluster a script that takes what daemons of the release before this one counted).
// Another
// daemon sharing the store reads the same usage at the same cost, once the writer has
// sent its counts (within usageFlushEvery).
func TestUsageReadCost(t *testing.T) {
	t.Parallel()
	const records, maxCommands = 40, 3
	check := func(t *testing.T, url string) {
		writer, _ := countedStore(t, url)
		reader, counter := countedStore(t, url)
		ctx := t.Context()
		tenant := fmt.Sprintf("cost-%d", time.Now().UnixNano())
		for i := range records {
			c := engine.Claim{ID: engine.ID{Tenant: tenant, Key: fmt.Sprintf("order-%d", i)}, Lease: time.Minute,
				Retention: time.Hour, Token: engine.NewLeaseToken()}
			if _, err := writer.Claim(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		// The first call of a store learns the deployment's kind, and loads the script, once.
		if _, err := reader.Usage(ctx, "nobody"); err != nil {
			t.Fatal(err)
		}
		var u engine.Usage
		wait.For(t, 30*time.Second, "the writer's counts to reach the reader", func() bool {
			var err error
			u, err = reader.Usage(ctx, tenant)
			return err == nil && u.Records == records
		})
		counter.take()
		if u, err := reader.Usage(ctx, tenant); err != nil || u.Records != records {
			t.Fatalf("usage read by another daemon: %+v %v, want %d records", u, err, records)
		}
		counts, total := counter.take()
		t.Logf("one usage read of %d records: %d commands %v", records, total, counts)
		if total > maxCommands || counts["hgetall"] > 0 {
			t.Fatalf("one usage read sent %d commands %v, want at most %d and no HGETALL", total, counts, maxCommands)
		}
		if _, err := reader.Usage(ctx, "nobody"); err != nil {
			t.Fatal(err)
		}
		if counts, total := counter.take(); total > maxCommands {
			t.Fatalf("reading a tenant that never wrote sent %d commands %v, want at most %d", total, counts, maxCommands)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		check(t, testredis.Start(t).URL())
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("starts a Redis Cluster")
		}
		check(t, testredis.StartCluster(t).URL())
	})
}

// BenchmarkUsage reads the usage of a tenant that keeps a number of records, on a
// standalone Redis and on a Cluster, and reports the commands each read sends:
// go test -run XXX -bench Usage ./internal/engine/redisstore/
func BenchmarkUsage(b *testing.B) {
	standalone := testredis.Start(b)
	var cluster *testredis.Cluster
	parent := b
	for _, bc := range []struct {
		deployment string
		records    int
	}{{"standalone", 100}, {"standalone", 10000}, {"cluster", 100}, {"cluster", 10000}} {
		b.Run(fmt.Sprintf("%s/%d_records", bc.deployment, bc.records), func(b *testing.B) {
			url := standalone.URL()
			if bc.deployment == "cluster" {
				if cluster == nil {
					cluster = testredis.StartCluster(parent)
				}
				url = cluster.URL()
			}
			s, counter := countedStore(b, url)
			ctx := b.Context()
			tenant := fmt.Sprintf("bench-%d", time.Now().UnixNano())
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for w := range 8 {
				wg.Go(func() {
					for i := w; i < bc.records; i += 8 {
						c := engine.Claim{ID: engine.ID{Tenant: tenant, Key: fmt.Sprintf("order-%d", i)}, Lease: time.Hour,
							Retention: time.Hour, Token: engine.NewLeaseToken()}
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
			counter.take()
			b.ResetTimer()
			for b.Loop() {
				u, err := s.Usage(ctx, tenant)
				if err != nil {
					b.Fatal(err)
				}
				if u.Records != int64(bc.records) {
					b.Fatalf("usage counts %d records, want %d", u.Records, bc.records)
				}
			}
			b.StopTimer()
			_, total := counter.take()
			b.ReportMetric(float64(total)/float64(b.N), "commands/read")
		})
	}
}

// TestUsageOnClusterOfOneMaster: a Redis with Cluster enabled, even as the only master
// reached by a plain redis:// URL, has its usage read as a Cluster's (the tenant's
// totals and a script that takes the earlier release's slots), and never the one hash the
// earlier release kept without Cluster.
func TestUsageOnClusterOfOneMaster(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-port", fmt.Sprint(testredis.FreePort(t)))
	if reply, err := srv.Command("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil || reply != "+OK" {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %q %v", reply, err)
	}
	s, counter := countedStore(t, srv.URL())
	ctx := t.Context()
	wait.For(t, 30*time.Second, "the node to serve its slots", func() bool {
		_, err := s.Claim(ctx, engine.Claim{ID: engine.ID{Tenant: "probe", Key: "k"}, Lease: time.Minute,
			Retention: time.Hour, Token: engine.NewLeaseToken()})
		return err == nil
	})
	if _, err := s.Usage(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
	const records = 10
	for i := range records {
		c := engine.Claim{ID: engine.ID{Tenant: "one", Key: fmt.Sprintf("order-%d", i)}, Lease: time.Minute,
			Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	counter.take()
	u, err := s.Usage(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	counts, _ := counter.take()
	if u.Records != records || counts["evalsha"] != 2 || counts["hgetall"] != 0 {
		t.Fatalf("usage %+v read by %v, want %d records read by two scripts", u, counts, records)
	}
	if reply, err := srv.Command("EXISTS", "\x00usage:one"); err != nil || reply != ":0" {
		t.Fatalf("EXISTS of the one usage hash of a store without slots: %q %v, want none", reply, err)
	}
}
