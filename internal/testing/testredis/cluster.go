package testredis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/testing/wait"
)

// Cluster is a Redis Cluster of real redis-server processes on loopback: three
// masters, each with one replica.
type Cluster struct {
	t     testing.TB
	Nodes []*Server
}

// StartCluster starts six nodes, joins them with redis-cli --cluster create (three
// masters, one replica each), waits until every node sees all slots served and every
// replica in sync, and stops them all when the test ends. extra is passed to every
// node. Under go test -short it skips the test: a cluster takes seconds to form.
func StartCluster(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no Redis Cluster")
	}
	Binary(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("IDEMD_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-cli is required (IDEMD_REQUIRE_REDIS is set) but not found: %v", err)
		}
		t.Skip("redis-cli not found; install it (apt-get install -y redis-tools) to run this test")
	}
	c := &Cluster{t: t}
	addrs := make([]string, 6)
	for i := range 6 {
		// The bus port is given explicitly: the default (port+10000) may be taken or
		// past 65535 for a port from the ephemeral range.
		// A replica whose link to its master was down for long (in node timeouts) may
		// not be promoted; tests kill masters under load and want the promotion, so the
		// check is off here (production keeps the default).
		var s *Server
		for attempt := 0; s == nil; attempt++ {
			args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
				"--cluster-port", strconv.Itoa(FreePort(t))}, extra...)
			// A taken port, the node's or its bus's, is tried again with two fresh ones.
			if s, err = tryStart(t, args...); err != nil && (attempt+1 == portAttempts || !errors.Is(err, errPortTaken)) {
				t.Fatal(err)
			}
		}
		c.Nodes = append(c.Nodes, s)
		addrs[i] = s.Addr()
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// URL is the redis+cluster:// URL of the cluster, naming every node.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

func info(ctx context.Context, addr, section string) (map[string]string, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	var text string
	var err error
	if section == "cluster" {
		text, err = client.ClusterInfo(ctx).Result()
	} else {
		text, err = client.Info(ctx, section).Result()
	}
	if err != nil {
		return nil, err
	}
	fields := make(map[string]string)
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields, nil
}

// WaitHealthy waits until every running node reports cluster_state:ok with all slots
// assigned, and every replica's link to its master is up.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := wait.Until(timeout, func() error {
		for _, n := range c.Nodes {
			if n.cmd == nil {
				continue
			}
			ci, err := info(ctx, n.Addr(), "cluster")
			if err != nil || ci["cluster_state"] != "ok" || ci["cluster_slots_ok"] != "16384" {
				return fmt.Errorf("%s: cluster %v %v", n.Addr(), ci, err)
			}
			ri, err := info(ctx, n.Addr(), "replication")
			if err != nil || (ri["role"] == "slave" && ri["master_link_status"] != "up") {
				return fmt.Errorf("%s: replication %v %v", n.Addr(), ri, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cluster not healthy: %w", err)
	}
	return nil
}

// Masters returns the running nodes that are masters now.
func (c *Cluster) Masters() []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		ri, err := info(context.Background(), n.Addr(), "replication")
		if err == nil && ri["role"] == "master" {
			out = append(out, n)
		}
	}
	return out
}

// Node returns the node listening on addr (host:port).
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	c.t.Fatalf("no node %s in the cluster", addr)
	return nil
}

// ReplicasOf returns the running replicas of master.
func (c *Cluster) ReplicasOf(master *Server) []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		if n.cmd == nil || n == master {
			continue
		}
		ri, err := info(context.Background(), n.Addr(), "replication")
		if err == nil && ri["role"] == "slave" && ri["master_port"] == strconv.Itoa(master.Port) {
			out = append(out, n)
		}
	}
	return out
}
