package redisstore_test

import (
	"context"
	"fmt"
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
func TestUsageAgainstUsedMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("writes 20,000 records")
	}
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
	retention := 20 * time.Second
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
	t.Logf("%d records: counted %d bytes (%.0f a record), used_memory grew %d (%.0f a record): counted/used %.2f",
		u.Records, u.Bytes, float64(u.Bytes)/records, grown, float64(grown)/records, float64(u.Bytes)/float64(grown))
	if u.Records != records {
		t.Fatalf("counted %d records, want %d", u.Records, records)
	}
	if u.Bytes > grown || 3*u.Bytes < grown {
		t.Fatalf("counted %d bytes where used_memory grew %d: want between a third of it and all of it", u.Bytes, grown)
	}
	wait.For(t, 2*time.Minute, "every record to expire and leave the count", func() bool {
		u, err = s.Usage(ctx, tenant)
		return err == nil && u.Records == 0 && u.Bytes == 0
	})
	// Redis's active expiry removes the keys within a few of its cycles.
	wait.For(t, time.Minute, "Redis to remove the expired records", func() bool {
		n, err := client.DBSize(ctx).Result()
		// Besides one key of the store's, its heartbeat and the tenant's due index of
		// pending slots (due.go), which lives as long as a feed has not emptied it.
		return err == nil && n <= 3
	})
}
