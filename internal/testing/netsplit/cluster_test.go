package netsplit_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/netsplit"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// clusterLab is a Redis Cluster of three masters with a replica each, every node on a
// host of its own, and two daemons.
type clusterLab struct {
	lab    *netsplit.Lab
	nodes  []*netsplit.Node
	d1, d2 *netsplit.Node
}

func startClusterLab(t *testing.T, acks int) *clusterLab {
	if testing.Short() {
		t.Skip("-short: no Redis Cluster")
	}
	lab := netsplit.New(t)
	redisBin := testredis.Binary(t)
	bin, err := idemdBin()
	if err != nil {
		t.Fatal(err)
	}
	c := &clusterLab{lab: lab}
	var addrs []string
	for i := range 6 {
		n := lab.Node(fmt.Sprintf("redis%d", i+1))
		// Node timeout as in the other Cluster tests; a replica is promoted however long
		// its link was down, since the partition is what cuts it.
		startRedis(t, n, redisBin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0", "--cluster-announce-ip", n.IP)
		c.nodes = append(c.nodes, n)
		addrs = append(addrs, n.IP+":6379")
	}
	c.d1, c.d2 = lab.Node("d1"), lab.Node("d2")
	for _, n := range c.nodes {
		if err := wait.Until(30*time.Second, func() error { return n.Command("redis-cli", "ping").Run() }); err != nil {
			t.Fatalf("%s does not answer: %v", n.Name, err)
		}
	}
	create := append([]string{"--cluster", "create"}, addrs...)
	if out, err := c.nodes[0].Command("redis-cli", append(create, "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := wait.Until(30*time.Second, func() error {
		for _, n := range c.nodes {
			out, _ := n.Command("redis-cli", "cluster", "info").Output()
			if !strings.Contains(string(out), "cluster_state:ok") || !strings.Contains(string(out), "cluster_known_nodes:6") {
				return fmt.Errorf("%s: %s", n.Name, out)
			}
			if r := first(n, "role"); r == "slave" && !strings.Contains(roleOf(n), "connected") {
				return fmt.Errorf("%s has not caught up: %s", n.Name, roleOf(n))
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("the cluster did not form: %v", err)
	}
	store := "redis+cluster://" + strings.Join(addrs, ",")
	for _, d := range []*netsplit.Node{c.d1, c.d2} {
		p := d.Start(bin, "--listen", "127.0.0.1:8080", "--store", store, "--log-level", "warn",
			"--redis-replica-acks", strconv.Itoa(acks), "--redis-replica-timeout", "250ms")
		if out, err := helper(d, "ready").CombinedOutput(); err != nil {
			t.Fatalf("%s is not ready: %v: %s\n%s", d.Name, err, out, p.Output())
		}
	}
	return c
}

// roleOf is what ROLE answers on n, on one line.
func roleOf(n *netsplit.Node) string {
	out, _ := n.Command("redis-cli", "role").Output()
	return strings.Join(strings.Fields(string(out)), " ")
}

// masterAndReplica finds a master and the node that replicates it.
func (c *clusterLab) masterAndReplica(t *testing.T) (master, replica *netsplit.Node) {
	for _, r := range c.nodes {
		f := strings.Fields(roleOf(r))
		if len(f) < 2 || f[0] != "slave" {
			continue
		}
		for _, m := range c.nodes {
			if m.IP == f[1] {
				return m, r
			}
		}
	}
	t.Fatal("no replica found")
	return nil, nil
}

// TestClusterMasterIsolated is TestSentinelMasterIsolated on a Redis Cluster: one
// master and one daemon are cut off from the other five nodes and the other daemon;
// the majority promotes the master's replica, the partition heals, and the old master
// rejoins as a replica, discarding what it took meanwhile. With one replica
// acknowledgement nothing acknowledged is lost, no key is acquired twice and the
// history is linearizable; without, the loss is measured and logged.
func TestClusterMasterIsolated(t *testing.T) {
	for _, acks := range []int{1, 0} {
		t.Run(fmt.Sprintf("replica acks %d", acks), func(t *testing.T) {
			c := startClusterLab(t, acks)
			master, replica := c.masterAndReplica(t)
			promoted := func() error {
				if r := first(replica, "role"); r != "master" {
					return fmt.Errorf("%s is still %q", replica.Name, r)
				}
				return nil
			}
			rejoined := func() error {
				if r := roleOf(master); !strings.HasPrefix(r, "slave "+replica.IP) || !strings.Contains(r, "connected") {
					return fmt.Errorf("the old master is %q", r)
				}
				return nil
			}
			isolateMaster(t, acks, c.lab, master, c.d1, c.d2, promoted, rejoined)
		})
	}
}
