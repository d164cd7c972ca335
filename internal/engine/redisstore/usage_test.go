package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// TestUsageAgainstUsedMemory holds the usage a tenant is counted to what Redis itself
// says its records take: used_memory grows by more than the counted bytes (Redis's own
// overhead of each key, its expiry entry, the usage hashes), but for records this small
// by no more than three times them, and once every record has expired, by retention in Redis, silently, the count
// is nothing again and so are the records.
//
// Its premise is that no record expires before it is counted, so the retention must
// outlast the writing, whose length depends on the machine: an attempt whose writing
// and count took longer than its retention proves nothing and is run again, on a fresh
// Redis, with a retention of twice what that attempt took.
func TestUsageAgainstUsedMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("writes 20,000 records")
	}
	retention := 20 * time.Second
	for attempt := 1; ; attempt++ {
		took, counted := usageAgainstUsedMemory(t, retention)
		if counted {
			return
		}
		if attempt == 4 {
			t.Fatalf("writing and counting took %v, longer than the retention of %v, %d times", took, retention, attempt)
		}
		t.Logf("writing and counting took %v, longer than the retention of %v: again with %v", took, retention, 2*took)
		retention = 2 * took
	}
}

// usageAgainstUsedMemory is one attempt of TestUsageAgainstUsedMemory with records kept
// for retention. It answers how long the writing and the count took, and whether they
// took less than the retention; only then has it checked anything.
func usageAgainstUsedMemory(t *testing.T, retention time.Duration) (time.Duration, bool) {
	srv := testredis.Start(t)
	s, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	usedMemory := func() int64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		return redisstore.InfoField(info, "used_memory")
	}
	const tenant, records = "measured", 20000
	// Written once without counting, so that Redis's own structures have grown first.
	if _, err := s.Usage(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	before := usedMemory()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < records; i += 8 {
				id := engine.ID{Tenant: tenant, Key: fmt.Sprintf("order-%040d", i)}
				c := engine.Claim{ID: id, Fingerprint: "0123456789abcdef0123456789abcdef", Lease: 30 * time.Second,
					Retention: retention, Token: engine.NewLeaseToken()}
				if _, err := s.Claim(ctx, c); err != nil {
					errs <- err
					return
				}
				if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: retention,
					Response: engine.Response{Status: 201, Body: make([]byte, 100)}}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	grown := usedMemory() - before
	u, err := s.Usage(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	// The first record was written after start, so none had expired if this holds.
	if took := time.Since(start); took >= retention {
		return took, false
	}
	t.Logf("%d records: counted %d bytes (%.0f a record), used_memory grew %d (%.0f a record): counted/used %.2f",
		u.Records, u.Bytes, float64(u.Bytes)/records, grown, float64(grown)/records, float64(u.Bytes)/float64(grown))
	if u.Records != records {
		t.Fatalf("counted %d records, want %d", u.Records, records)
	}
	if u.Bytes > grown || 3*u.Bytes < grown {
		t.Fatalf("counted %d bytes where used_memory grew %d: want between a third of it and all of it", u.Bytes, grown)
	}
	wait.For(t, 2*time.Minute+retention, "every record to expire and leave the count", func() bool {
		u, err = s.Usage(ctx, tenant)
		return err == nil && u.Records == 0 && u.Bytes == 0
	})
	// Redis's active expiry removes the keys within a few of its cycles. What is left is
	// the store's bookkeeping: the layout key, and the tenant's keys that start with a
	// zero byte (its usage totals, its due index).
	wait.For(t, time.Minute, "Redis to remove the expired records", func() bool {
		keys, err := client.Keys(ctx, "*").Result()
		if err != nil {
			return false
		}
		for _, k := range keys {
			if k != redisstore.LayoutKey && !strings.HasPrefix(k, "\x00") {
				return false
			}
		}
		return true
	})
	return time.Since(start), true
}

// TestUsageHealsWhatADaemonLost: counts that are wrong, as a daemon leaves them when it
// dies between a script and sending what the script counted (a record counted and never
// taken away, or taken away and never counted), leave the usage when the span of the
// records concerned ends, and the usage is exact again.
func TestUsageHealsWhatADaemonLost(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	s, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	const tenant = "healed"
	for i := range 3 {
		c := engine.Claim{ID: engine.ID{Tenant: tenant, Key: fmt.Sprintf("k-%d", i)}, Lease: time.Minute,
			Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	exact, err := s.Usage(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if exact.Records != 3 {
		t.Fatalf("3 records counted as %+v", exact)
	}
	soon := time.Now().Add(2 * time.Second)
	s.CountUsage(tenant, soon, 5, 5000)
	s.CountUsage(tenant, soon.Add(redisstore.UsageSpan), -1, -100)
	if u, err := s.Usage(ctx, tenant); err != nil || u.Records != exact.Records+4 || u.Bytes != exact.Bytes+4900 {
		t.Fatalf("usage with lost counts: %+v %v, want %d records and %d bytes", u, err, exact.Records+4, exact.Bytes+4900)
	}
	wait.For(t, time.Minute, "the lost counts' spans to end", func() bool {
		u, err := s.Usage(ctx, tenant)
		return err == nil && u.Records == exact.Records && u.Bytes == exact.Bytes
	})
}

// TestUsageFoldsTheEarlierReleasesCounts: what daemons of the release before this one
// counted where they kept it (one hash of a tenant without Cluster; a hash a slot and
// a bitmap of those slots on a Cluster) is counted at the next read and folded into the
// tenant's totals, once: the earlier keys are gone, and spans that ended are not
// counted.
func TestUsageFoldsTheEarlierReleasesCounts(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, url string, cluster bool) {
		s, err := redisstore.OpenWith(url, redisstore.Options{LeanRecords: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		client, err := redisstore.NewClient(url)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		ctx := t.Context()
		tenant := fmt.Sprintf("earlier-%d", time.Now().UnixNano())
		span := func(at time.Time) string {
			ms := redisstore.UsageSpan.Milliseconds()
			return fmt.Sprint((at.UnixMilli() + ms - 1) / ms)
		}
		later, ended := span(time.Now().Add(time.Hour)), span(time.Now().Add(-time.Hour))
		packed := func(records, bytes int64) int64 { return bytes*redisstore.UsageByte + records }
		var earlier []string
		if cluster {
			for i, slot := range []uint16{5, 9000} {
				key := redisstore.UsageKey(tenant, slot)
				earlier = append(earlier, key)
				if err := client.HSet(ctx, key, later, packed(int64(i+1), 100), ended, packed(7, 700)).Err(); err != nil {
					t.Fatal(err)
				}
				if err := client.SetBit(ctx, redisstore.UsageSlotsKey(tenant), int64(slot), 1).Err(); err != nil {
					t.Fatal(err)
				}
			}
			earlier = append(earlier, redisstore.UsageSlotsKey(tenant))
		} else {
			key := "\x00usage:" + tenant
			earlier = append(earlier, key)
			if err := client.HSet(ctx, key, later, packed(3, 200), ended, packed(7, 700)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// A record written by this release beside them.
		if _, err := s.Claim(ctx, engine.Claim{ID: engine.ID{Tenant: tenant, Key: "new"}, Lease: time.Minute,
			Retention: time.Hour, Token: engine.NewLeaseToken()}); err != nil {
			t.Fatal(err)
		}
		first, err := s.Usage(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if first.Records != 4 || first.Bytes <= 200 {
			t.Fatalf("usage with 3 records counted by the earlier release and 1 by this one: %+v", first)
		}
		for _, key := range earlier {
			if n, err := client.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("the earlier release's %q is still there after a read (%d, %v)", key, n, err)
			}
		}
		if again, err := s.Usage(ctx, tenant); err != nil || again != first {
			t.Fatalf("a second read: %+v %v, want %+v as the first", again, err, first)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		check(t, testredis.Start(t).URL(), false)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("starts a Redis Cluster")
		}
		check(t, testredis.StartCluster(t).URL(), true)
	})
}

// TestUsageSentAtClose: a daemon that stops sends what its scripts counted and it had
// not sent yet, so that another daemon's next read counts it at once.
func TestUsageSentAtClose(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	writer, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	ctx := t.Context()
	const tenant, records = "closing", 25
	for i := range records {
		c := engine.Claim{ID: engine.ID{Tenant: tenant, Key: fmt.Sprintf("k-%d", i)}, Lease: time.Minute,
			Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := writer.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	if u, err := reader.Usage(ctx, tenant); err != nil || u.Records != records {
		t.Fatalf("usage after the writer closed: %+v %v, want %d records", u, err, records)
	}
}

// TestUsageReadOutOfMemory: a Redis that refuses writes for want of memory still has
// the usage read, with what the reading daemon counted and could not send, which it
// sends once Redis takes writes again.
func TestUsageReadOutOfMemory(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	s, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	const tenant = "full"
	claim := func(key string) {
		t.Helper()
		c := engine.Claim{ID: engine.ID{Tenant: tenant, Key: key}, Lease: time.Minute, Retention: time.Hour,
			Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	claim("sent")
	if u, err := s.Usage(ctx, tenant); err != nil || u.Records != 1 {
		t.Fatalf("usage: %+v %v, want 1 record", u, err)
	}
	claim("unsent")
	if reply, err := srv.Command("CONFIG", "SET", "maxmemory", "1"); err != nil || reply != "+OK" {
		t.Fatalf("CONFIG SET maxmemory: %q %v", reply, err)
	}
	if u, err := s.Usage(ctx, tenant); err != nil || u.Records != 2 {
		t.Fatalf("usage on a Redis out of memory: %+v %v, want 2 records", u, err)
	}
	other, err := redisstore.OpenWith(srv.URL(), redisstore.Options{LeanRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// Redis took none of it: another daemon counts what was sent before.
	if u, err := other.Usage(ctx, tenant); err != nil || u.Records != 1 {
		t.Fatalf("another daemon's usage on a Redis out of memory: %+v %v, want 1 record", u, err)
	}
	if reply, err := srv.Command("CONFIG", "SET", "maxmemory", "0"); err != nil || reply != "+OK" {
		t.Fatalf("CONFIG SET maxmemory: %q %v", reply, err)
	}
	wait.For(t, 30*time.Second, "the counts held back to be sent", func() bool {
		u, err := other.Usage(ctx, tenant)
		return err == nil && u.Records == 2
	})
}
