package redisstore_test

import (
	"path/filepath"
	"testing"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// TestMoveLive holds the live move to enginetest.RunMove between real stores: the
// embedded store into Redis, one Redis layout into another, Redis into a Cluster and
// a Cluster into Redis.
func TestMoveLive(t *testing.T) {
	t.Parallel()
	redisStore := func(url string, opts redisstore.Options) enginetest.NewStore {
		return func(t *testing.T) engine.Store {
			s, err := redisstore.OpenWith(url, opts)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	bolt := func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The old store's connections are named as a migrating daemon's, which the copier
	// does not count as daemons serving the old store alone: the test's own daemon of
	// the old store shares them (cmd/idemd's test has daemons of their own).
	old := func(opts redisstore.Options) redisstore.Options {
		opts.ClientName = redisstore.MigratingClientName
		return opts
	}
	t.Run("embedded to redis", func(t *testing.T) {
		t.Parallel()
		to := testredis.Start(t)
		enginetest.RunMove(t, bolt, redisStore(to.URL(), redisstore.Options{LeanRecords: true}))
	})
	t.Run("redis strings to redis lean", func(t *testing.T) {
		t.Parallel()
		from, to := testredis.Start(t), testredis.Start(t)
		enginetest.RunMove(t, redisStore(from.URL(), old(redisstore.Options{})), redisStore(to.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
	t.Run("redis hashes to redis strings", func(t *testing.T) {
		t.Parallel()
		from, to := testredis.Start(t), testredis.Start(t)
		enginetest.RunMove(t, redisStore(from.URL(), old(redisstore.Options{HashRecords: true})), redisStore(to.URL(), redisstore.Options{}))
	})
	t.Run("redis lean to embedded", func(t *testing.T) {
		t.Parallel()
		from := testredis.Start(t)
		enginetest.RunMove(t, redisStore(from.URL(), old(redisstore.Options{LeanRecords: true, LeanOnly: true})), bolt)
	})
	t.Run("redis to cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster is not started in -short")
		}
		t.Parallel()
		from, to := testredis.Start(t), testredis.StartCluster(t)
		enginetest.RunMove(t, redisStore(from.URL(), old(redisstore.Options{})), redisStore(to.URL(), redisstore.Options{LeanRecords: true}))
	})
	// The copier looks over the old Cluster's masters in parallel.
	t.Run("cluster to redis", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster is not started in -short")
		}
		t.Parallel()
		from, to := testredis.StartCluster(t), testredis.Start(t)
		enginetest.RunMove(t, redisStore(from.URL(), old(redisstore.Options{LeanRecords: true})), redisStore(to.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
	})
}

// TestMoveBatch holds the copier's batch steps to each key's step alone
// (enginetest.RunMoveBatch): every Redis layout into the lean one, the embedded store
// into Redis and back, and out of a Cluster, whose batches go to every master.
func TestMoveBatch(t *testing.T) {
	t.Parallel()
	redisStore := func(url string, opts redisstore.Options) enginetest.NewStore {
		return func(t *testing.T) engine.Store {
			s, err := redisstore.OpenWith(url, opts)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	bolt := func(t *testing.T) engine.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, layout := range []struct {
		name string
		opts redisstore.Options
	}{{"hashes", redisstore.Options{HashRecords: true}}, {"strings", redisstore.Options{}}, {"lean", redisstore.Options{LeanRecords: true, LeanOnly: true}}} {
		t.Run("redis "+layout.name+" to redis lean", func(t *testing.T) {
			t.Parallel()
			from, to := testredis.Start(t), testredis.Start(t)
			enginetest.RunMoveBatch(t, redisStore(from.URL(), layout.opts), redisStore(to.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}))
		})
	}
	t.Run("embedded to redis", func(t *testing.T) {
		t.Parallel()
		enginetest.RunMoveBatch(t, bolt, redisStore(testredis.Start(t).URL(), redisstore.Options{LeanRecords: true}))
	})
	t.Run("redis to embedded", func(t *testing.T) {
		t.Parallel()
		enginetest.RunMoveBatch(t, redisStore(testredis.Start(t).URL(), redisstore.Options{}), bolt)
	})
	t.Run("cluster to redis", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster is not started in -short")
		}
		t.Parallel()
		from, to := testredis.StartCluster(t), testredis.Start(t)
		enginetest.RunMoveBatch(t, redisStore(from.URL(), redisstore.Options{LeanRecords: true}), redisStore(to.URL(), redisstore.Options{LeanRecords: true}))
	})
}
