package netsplit_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/netsplit"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// ping asks the Redis on to for PING from from, giving up after 2 s.
func ping(from, to *netsplit.Node) error {
	out, err := from.Command("timeout", "2", "redis-cli", "-h", to.IP, "-p", "6379", "ping").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "PONG" {
		return &answer{fmt.Sprintf("%v: %s", err, out)}
	}
	return nil
}

type answer struct{ s string }

func (a *answer) Error() string { return "answered " + a.s }

// TestPartitionAndHeal: nodes on one switch reach each other; a partition stops it both
// ways while each side still reaches itself; healing restores it; a block cuts one
// pair only.
func TestPartitionAndHeal(t *testing.T) {
	lab := netsplit.New(t)
	bin := testredis.Binary(t)
	a, b, c := lab.Node("a"), lab.Node("b"), lab.Node("c")
	for _, n := range []*netsplit.Node{a, b, c} {
		n.Start(bin, "--port", "6379", "--bind", n.IP+" 127.0.0.1", "--protected-mode", "no", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir())
	}
	reach := func(from, to *netsplit.Node) {
		t.Helper()
		if err := wait.Until(20*time.Second, func() error { return ping(from, to) }); err != nil {
			t.Fatalf("%s does not reach %s: %v", from.Name, to.Name, err)
		}
	}
	cut := func(from, to *netsplit.Node) {
		t.Helper()
		if err := ping(from, to); err == nil {
			t.Fatalf("%s still reaches %s", from.Name, to.Name)
		}
	}
	reach(a, b)
	reach(b, c)

	lab.Partition(a)
	cut(a, b)
	cut(c, a)
	reach(a, a)
	reach(b, c)

	lab.Heal()
	reach(a, b)
	reach(c, a)

	a.Block(b)
	cut(a, b)
	cut(b, a)
	reach(a, c)
	reach(c, b)
	lab.Heal()
	reach(a, b)
}
