package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testredis"
)

// TestCluster runs the conformance suite, unchanged, on a real Redis Cluster, and
// checks that records spread over every master.
func TestCluster(t *testing.T) {
	cluster := testredis.StartCluster(t)
	t.Run("conformance", func(t *testing.T) {
		enginetest.Run(t, func(t *testing.T) engine.Store {
			s, err := redisstore.Open(cluster.URL())
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
	t.Run("records spread over all masters", func(t *testing.T) {
		s, err := redisstore.Open(cluster.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		prefix := fmt.Sprintf("spread-%d", time.Now().UnixNano())
		for i := range 300 {
			c := engine.Claim{ID: engine.ID{Tenant: "spread", Key: fmt.Sprintf("%s-%d", prefix, i)},
				Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
			if _, err := s.Claim(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		masters := cluster.Masters()
		if len(masters) != 3 {
			t.Fatalf("%d masters, want 3", len(masters))
		}
		total := 0
		for _, m := range masters {
			reply, err := m.Command("EVAL", "return #redis.call('KEYS', 'idem:spread:*')", "0")
			n, convErr := strconv.Atoi(strings.TrimPrefix(reply, ":"))
			if err != nil || convErr != nil {
				t.Fatalf("counting keys on %s: %q %v", m.Addr(), reply, err)
			}
			if n < 50 {
				t.Errorf("master %s holds %d of 300 records; keys are not spread", m.Addr(), n)
			}
			total += n
		}
		if total != 300 {
			t.Fatalf("masters hold %d records in all, want 300", total)
		}
	})
}
