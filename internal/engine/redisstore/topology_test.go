package redisstore_test

import (
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

func openStore(t *testing.T, url string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wantTopology checks that Topology names exactly the masters and replicas given,
// each master answered, and each replica is online with a round trip.
func wantTopology(t *testing.T, s *redisstore.Store, want map[string][]string) []redisstore.Node {
	t.Helper()
	var nodes []redisstore.Node
	// A replica shows as online once its master has it in sync; a fresh one may
	// still be loading.
	wait.For(t, 20*time.Second, "every replica online", func() bool {
		var err error
		if nodes, err = s.Topology(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			for _, r := range n.Replicas {
				if r.State != "online" {
					return false
				}
			}
		}
		return true
	})
	if len(nodes) != len(want) {
		t.Fatalf("%d masters %+v, want %d", len(nodes), nodes, len(want))
	}
	for _, n := range nodes {
		replicas, ok := want[n.Address]
		if !ok || n.Err != nil || n.RoundTrip <= 0 {
			t.Fatalf("master %+v: not one of %v, or no round trip", n, want)
		}
		if len(n.Replicas) != len(replicas) {
			t.Fatalf("master %s: replicas %+v, want %v", n.Address, n.Replicas, replicas)
		}
		for i, r := range n.Replicas {
			if r.Address != replicas[i] || r.Err != nil || r.RoundTrip <= 0 || r.LagBytes < 0 {
				t.Fatalf("master %s: replica %+v, want %s answering a PING", n.Address, r, replicas[i])
			}
		}
	}
	return nodes
}

func TestTopologyStandalone(t *testing.T) {
	srv := testredis.Start(t)
	wantTopology(t, openStore(t, srv.URL()), map[string][]string{srv.Addr(): {}})
}

// TestTopologySentinel: the master the Sentinels chose, by its own address, and its
// replica; a replica that stops answering is still listed, with the error of its PING.
func TestTopologySentinel(t *testing.T) {
	sen := testredis.StartSentinel(t)
	s := openStore(t, sen.URL())
	wantTopology(t, s, map[string][]string{sen.Master.Addr(): {sen.Replica.Addr()}})

	sen.Replica.Pause()
	defer sen.Replica.Resume()
	nodes, err := s.Topology(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || len(nodes[0].Replicas) != 1 || nodes[0].Replicas[0].Err == nil {
		t.Fatalf("with the replica paused: %+v, want it listed with a PING error", nodes)
	}
}

func TestTopologyCluster(t *testing.T) {
	cluster := testredis.StartCluster(t)
	want := map[string][]string{}
	for _, m := range cluster.Masters() {
		want[m.Addr()] = []string{}
		for _, r := range cluster.ReplicasOf(m) {
			want[m.Addr()] = append(want[m.Addr()], r.Addr())
		}
	}
	wantTopology(t, openStore(t, cluster.URL()), want)
}
