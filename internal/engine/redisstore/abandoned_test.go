package redisstore_test

import (
	"testing"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// BenchmarkAbandoned reads the abandoned-keys feed on a standalone Redis and on a
// Cluster of three masters: go test -run '^$' -bench Abandoned ./internal/engine/redisstore
// (IDEMD_FEED_RECORDS=1000000 for the figure in docs/benchmarks.md).
func BenchmarkAbandoned(b *testing.B) {
	b.Run("standalone", func(b *testing.B) {
		srv := testredis.Start(b)
		enginetest.BenchAbandoned(b, func(b *testing.B) engine.Store {
			s, err := redisstore.Open(srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	})
	b.Run("cluster", func(b *testing.B) {
		cluster := testredis.StartCluster(b)
		enginetest.BenchAbandoned(b, func(b *testing.B) engine.Store {
			s, err := redisstore.Open(cluster.URL())
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	})
}
