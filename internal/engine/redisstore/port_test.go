package redisstore_test

import (
	"path/filepath"
	"testing"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testredis"
)

// TestPort moves records between every layout, to and from the embedded store, and
// onto a Cluster.
func TestPort(t *testing.T) {
	t.Parallel()
	from, to := testredis.Start(t), testredis.Start(t)
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
	layouts := []struct {
		name string
		opts redisstore.Options
	}{
		{"hashes", redisstore.Options{HashRecords: true}},
		{"strings", redisstore.Options{}},
		{"lean", redisstore.Options{LeanRecords: true}},
		{"lean-only", redisstore.Options{LeanRecords: true, LeanOnly: true}},
	}
	for _, a := range layouts {
		for _, b := range layouts {
			t.Run(a.name+" to "+b.name, func(t *testing.T) {
				enginetest.RunPort(t, redisStore(from.URL(), a.opts), redisStore(to.URL(), b.opts))
			})
		}
	}
	t.Run("embedded to lean", func(t *testing.T) {
		enginetest.RunPort(t, bolt, redisStore(to.URL(), redisstore.Options{LeanRecords: true}))
	})
	t.Run("lean-only to embedded", func(t *testing.T) {
		enginetest.RunPort(t, redisStore(from.URL(), redisstore.Options{LeanRecords: true, LeanOnly: true}), bolt)
	})
	t.Run("strings to Cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster takes long to start")
		}
		cluster := testredis.StartCluster(t)
		enginetest.RunPort(t, redisStore(from.URL(), redisstore.Options{}), redisStore(cluster.URL(), redisstore.Options{LeanRecords: true}))
	})
}
