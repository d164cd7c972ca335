// Package netsplit puts the processes of a test on hosts of their own, network
// namespaces joined by veth pairs to one switch, so that a test can split the network
// between them and heal it: what a partition does to Redis replication, Sentinel and
// the daemons on each side, which killing a process cannot show.
//
// A Lab has a hub namespace with two bridges. Every node's link starts on the first;
// Partition moves the links of one side to the second, so that the sides stop hearing
// each other at once and in silence (frames go nowhere, connections hang until their
// timeouts), while each side still works within itself. Heal moves them back. Block
// cuts one node off from some others by a blackhole route in its namespace, which
// fails its connections to them at once. Lose drops a share of a link's packets at
// random (nftables), and Relay lengthens a connection's round trip, in place of
// netem, which not every kernel has. It needs root (CAP_NET_ADMIN), iproute2 and, for
// Lose, nftables; a test without them is skipped with a message.
//
// Every namespace, link and process a Lab makes is named after the test process's PID
// and removed when the test ends; nothing touches the machine's own namespace but the
// veth pairs on their way in.
package netsplit

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testdaemon"
)

// Lab is a set of nodes on one switch.
type Lab struct {
	t      testing.TB
	prefix string
	hub    string
	mu     sync.Mutex
	nodes  []*Node
	routes map[[2]*Node]bool
	lossy  map[*Node]bool
}

// Node is one host: a network namespace with one address on the switch.
type Node struct {
	Name string
	// NS is the namespace's name, for ip netns exec.
	NS string
	// IP is the node's address on the switch, 10.88.0.N.
	IP   string
	lab  *Lab
	port string // the hub's end of the node's link
}

// Supported says why the machine cannot host a Lab, or "" when it can.
func Supported() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "ip (iproute2) is not installed"
	}
	return ""
}

// New makes a Lab and removes it when the test ends; without root or iproute2 it skips
// the test, and fails it when IDEMD_REQUIRE_NETNS is set (as CI sets it).
func New(t testing.TB) *Lab {
	t.Helper()
	if why := Supported(); why != "" {
		skip(t, why)
	}
	l := &Lab{t: t, prefix: fmt.Sprintf("ns%d", os.Getpid()%100000), routes: map[[2]*Node]bool{}, lossy: map[*Node]bool{}}
	l.prefix = uniquePrefix(l.prefix)
	l.hub = l.prefix + "-hub"
	t.Cleanup(l.remove)
	l.ip("netns", "add", l.hub)
	for _, br := range []string{"br0", "br1"} {
		l.ip("-n", l.hub, "link", "add", br, "type", "bridge")
		l.ip("-n", l.hub, "link", "set", br, "up")
	}
	return l
}

// skip skips the test for why, or fails it when IDEMD_REQUIRE_NETNS is set.
func skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("IDEMD_REQUIRE_NETNS") != "" {
		t.Fatalf("netsplit: %s, and IDEMD_REQUIRE_NETNS is set", why)
	}
	t.Skipf("netsplit: %s; skipping", why)
}

var labs struct {
	sync.Mutex
	n int
}

// uniquePrefix keeps the Labs of one test process apart.
func uniquePrefix(p string) string {
	labs.Lock()
	defer labs.Unlock()
	labs.n++
	return fmt.Sprintf("%s%c", p, 'a'+rune(labs.n%26))
}

// Node adds a host named name, linked to the switch, with its loopback up.
func (l *Lab) Node(name string) *Node {
	l.t.Helper()
	l.mu.Lock()
	n := &Node{Name: name, lab: l}
	l.nodes = append(l.nodes, n)
	i := len(l.nodes)
	l.mu.Unlock()
	n.NS = fmt.Sprintf("%s-%d", l.prefix, i)
	n.IP = fmt.Sprintf("10.88.0.%d", i)
	n.port = fmt.Sprintf("%sh%d", l.prefix, i)
	inner := fmt.Sprintf("%sn%d", l.prefix, i)
	l.ip("netns", "add", n.NS)
	l.ip("link", "add", n.port, "type", "veth", "peer", "name", inner)
	l.ip("link", "set", n.port, "netns", l.hub)
	l.ip("link", "set", inner, "netns", n.NS)
	l.ip("-n", n.NS, "link", "set", inner, "name", "eth0")
	l.ip("-n", n.NS, "addr", "add", n.IP+"/24", "dev", "eth0")
	l.ip("-n", n.NS, "link", "set", "eth0", "up")
	l.ip("-n", n.NS, "link", "set", "lo", "up")
	l.ip("-n", l.hub, "link", "set", n.port, "master", "br0")
	l.ip("-n", l.hub, "link", "set", n.port, "up")
	return n
}

// Partition splits the switch: side hears only side, the other nodes only each other.
func (l *Lab) Partition(side ...*Node) {
	l.t.Helper()
	for _, n := range side {
		l.ip("-n", l.hub, "link", "set", n.port, "master", "br1")
	}
}

// Heal puts every node back on one switch and removes every Block and Lose.
func (l *Lab) Heal() {
	l.t.Helper()
	l.mu.Lock()
	nodes := append([]*Node(nil), l.nodes...)
	routes, lossy := l.routes, l.lossy
	l.routes, l.lossy = map[[2]*Node]bool{}, map[*Node]bool{}
	l.mu.Unlock()
	for _, n := range nodes {
		l.ip("-n", l.hub, "link", "set", n.port, "master", "br0")
	}
	for pair := range routes {
		l.ip("-n", pair[0].NS, "route", "del", "blackhole", pair[1].IP+"/32")
	}
	for n := range lossy {
		if out, err := exec.Command("ip", "netns", "exec", n.NS, "nft", "delete", "table", "inet", "netsplit").CombinedOutput(); err != nil {
			l.t.Fatalf("netsplit: nft on %s: %v\n%s", n.Name, err, out)
		}
	}
}

// Block cuts n off from others, both ways, by blackhole routes: their connections fail
// at once instead of hanging, and n still reaches every other node.
func (n *Node) Block(others ...*Node) {
	l := n.lab
	l.t.Helper()
	for _, o := range others {
		for _, pair := range [][2]*Node{{n, o}, {o, n}} {
			l.mu.Lock()
			done := l.routes[pair]
			l.routes[pair] = true
			l.mu.Unlock()
			if !done {
				l.ip("-n", pair[0].NS, "route", "add", "blackhole", pair[1].IP+"/32")
			}
		}
	}
}

// Command is name run in the node's namespace.
func (n *Node) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.NS, name}, args...)...)
	// A group of its own, so that stopping it stops what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// Start runs name in the node's namespace until the test ends, then stops it (SIGTERM
// to its group, SIGKILL after 5 s). Its output goes to the returned buffer.
func (n *Node) Start(name string, args ...string) *Proc {
	l := n.lab
	l.t.Helper()
	p := &Proc{cmd: n.Command(name, args...)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		l.t.Fatalf("netsplit: start %s on %s: %v", name, n.Name, err)
	}
	p.done = make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	l.t.Cleanup(p.Stop)
	return p
}

// Proc is a process a node runs.
type Proc struct {
	cmd  *exec.Cmd
	out  testdaemon.Logs
	done chan struct{}
}

// Pid is the process's ID: ip netns exec runs the command in its own place.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Output is what the process has written so far.
func (p *Proc) Output() string { return p.out.String() }

// Exited says whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process and what it started.
func (p *Proc) Stop() {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

func (l *Lab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("netsplit: ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// remove deletes the Lab's namespaces, which takes their links with them.
func (l *Lab) remove() {
	l.mu.Lock()
	nodes := l.nodes
	l.mu.Unlock()
	for _, n := range nodes {
		_ = exec.Command("ip", "netns", "del", n.NS).Run()
	}
	_ = exec.Command("ip", "netns", "del", l.hub).Run()
}
