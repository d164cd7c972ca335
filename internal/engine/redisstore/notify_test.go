package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// stats reads the "name:value" lines of an INFO or CLUSTER INFO answer whose name
// starts with prefix.
func stats(t *testing.T, addr, prefix string, cluster bool) map[string]string {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	var text string
	var err error
	if cluster {
		text, err = client.ClusterInfo(t.Context()).Result()
	} else {
		text, err = client.Info(t.Context(), "commandstats").Result()
	}
	if err != nil {
		t.Fatalf("%s: %v", addr, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return out
}

// publishes counts PUBLISH and SPUBLISH calls on a server, scripts' included.
func publishes(t *testing.T, addr string) int {
	t.Helper()
	n := 0
	for k, v := range stats(t, addr, "cmdstat_", false) {
		if k != "cmdstat_publish" && k != "cmdstat_spublish" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		c, _ := strconv.Atoi(calls)
		n += c
	}
	return n
}

func waitNotified(t *testing.T, w engine.Watch, after string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(wait.Scale(10 * time.Second)):
		t.Fatalf("no notification in time after %s", after)
	}
}

// TestPublishOnlyWhenWatched: a completion nobody waits for publishes nothing; a
// watched one, or one a waiting claim saw, does.
func TestPublishOnlyWhenWatched(t *testing.T) {
	srv := testredis.Start(t)
	s, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	complete := func(id engine.ID, token string) {
		t.Helper()
		if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: token, Retention: time.Hour,
			Response: engine.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(id engine.ID) engine.Claim {
		t.Helper()
		c := engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
		if res, err := s.Claim(ctx, c); err != nil || res.Outcome != engine.OutcomeAcquired {
			t.Fatalf("claim: %+v %v", res, err)
		}
		return c
	}
	prefix := fmt.Sprintf("pub-%d", time.Now().UnixNano())

	before := publishes(t, srv.Addr())
	quiet := engine.ID{Tenant: "t", Key: prefix + "-quiet"}
	complete(quiet, claim(quiet).Token)
	if n := publishes(t, srv.Addr()) - before; n != 0 {
		t.Fatalf("an unwatched completion published %d times", n)
	}

	watched := engine.ID{Tenant: "t", Key: prefix + "-watched"}
	c := claim(watched)
	w, err := s.Watch(ctx, watched)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	complete(watched, c.Token)
	waitNotified(t, w, "a watched completion")

	// A record created after the watch is marked by the claim that waits on it.
	late := engine.ID{Tenant: "t", Key: prefix + "-late"}
	w2, err := s.Watch(ctx, late)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	held := claim(late)
	waiter := engine.Claim{ID: late, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken(), Waiting: true}
	if _, err := s.Claim(ctx, waiter); err == nil {
		t.Fatal("a claim on a held key acquired")
	}
	complete(late, held.Token)
	waitNotified(t, w2, "a completion a waiting claim saw")
}

// testShardedNotification: on a Cluster a completion's notification reaches the
// waiter, and only its own shard's nodes exchange it (no cluster-wide PUBLISH).
func testShardedNotification(t *testing.T, cluster *testredis.Cluster) {
	s, err := redisstore.Open(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), wait.Scale(30*time.Second))
	defer cancel()
	id := engine.ID{Tenant: "t", Key: fmt.Sprintf("shard-%d", time.Now().UnixNano())}
	c := engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	if _, err := s.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	var master *testredis.Server
	for _, m := range cluster.Masters() {
		client := redis.NewClient(&redis.Options{Addr: m.Addr()})
		n, err := client.Exists(ctx, redisstore.RecordKey(id)).Result()
		client.Close()
		if err == nil && n == 1 {
			master = m
		}
	}
	if master == nil {
		t.Fatal("no master holds the record")
	}
	shard := map[string]bool{master.Addr(): true}
	for _, r := range cluster.ReplicasOf(master) {
		shard[r.Addr()] = true
	}
	before := map[string]map[string]string{}
	for _, n := range cluster.Nodes {
		before[n.Addr()] = stats(t, n.Addr(), "cluster_stats_messages_publish", true)
	}

	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
		Response: engine.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	waitNotified(t, w, "a completion on the cluster")

	for _, n := range cluster.Nodes {
		after := stats(t, n.Addr(), "cluster_stats_messages_publish", true)
		delta := func(k string) int {
			a, _ := strconv.Atoi(after[k])
			b, _ := strconv.Atoi(before[n.Addr()][k])
			return a - b
		}
		if d := delta("cluster_stats_messages_publish_sent") + delta("cluster_stats_messages_publish_received"); d != 0 {
			t.Errorf("%s exchanged %d cluster-wide publish messages", n.Addr(), d)
		}
		if shard[n.Addr()] {
			continue
		}
		if d := delta("cluster_stats_messages_publishshard_received"); d != 0 {
			t.Errorf("%s, outside the record's shard, received %d sharded messages", n.Addr(), d)
		}
	}
}
