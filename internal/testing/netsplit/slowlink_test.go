package netsplit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemd/idemd/internal/engine/lintest"
	"github.com/idemd/idemd/internal/loadtest/appbench"
	"github.com/idemd/idemd/internal/testing/netsplit"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// relay is the helper that slows a node's Redis down: it listens on NETSPLIT_LISTEN and
// passes every connection on to NETSPLIT_TARGET through netsplit.Relay, with
// NETSPLIT_DELAY each way and NETSPLIT_JITTER, until SIGTERM.
func relay() int {
	delay, err1 := time.ParseDuration(os.Getenv("NETSPLIT_DELAY"))
	jitter, err2 := time.ParseDuration(os.Getenv("NETSPLIT_JITTER"))
	ln, err3 := net.Listen("tcp", os.Getenv("NETSPLIT_LISTEN"))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	if err := netsplit.Relay(ctx, ln, os.Getenv("NETSPLIT_TARGET"), delay, jitter); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// link is what a daemon's way to Redis is like.
type link struct {
	rtt, jitter time.Duration // added to the round trip; jitter on each way
	loss        float64       // the share of packets dropped, each way
	pipelines   int           // --redis-pipelines; 0 for the default
}

func (l link) String() string {
	s := fmt.Sprintf("rtt=%s", l.rtt)
	if l.jitter > 0 {
		s += fmt.Sprintf(",jitter=%s", l.jitter)
	}
	if l.loss > 0 {
		s += fmt.Sprintf(",loss=%g%%", l.loss*100)
	}
	if l.pipelines > 0 {
		s += fmt.Sprintf(",pipelines=%d", l.pipelines)
	}
	return s
}

// slowLab is a Redis master with a replica, and a daemon (with one replica
// acknowledgement) whose way to the master goes through a relay that adds the link's
// round trip, over a link that drops its share of packets.
type slowLab struct {
	master, d           *netsplit.Node
	redis, relay, idemd *netsplit.Proc
}

func startSlowLab(t testing.TB, l link) *slowLab {
	lab := netsplit.New(t)
	redisBin := testredis.Binary(t)
	bin, err := idemdBin()
	if err != nil {
		t.Fatal(err)
	}
	s := &slowLab{master: lab.Node("master"), d: lab.Node("d")}
	replica := lab.Node("replica")
	s.redis = startRedis(t, s.master, redisBin)
	startRedis(t, replica, redisBin, "--replicaof", s.master.IP, "6379")
	if err := wait.Until(30*time.Second, func() error {
		out, err := s.master.Command("redis-cli", "info", "replication").Output()
		if err != nil || !strings.Contains(string(out), "connected_slaves:1") {
			return fmt.Errorf("the replica has not joined: %v: %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.relay = s.master.Start("env", "NETSPLIT_HELPER=relay", "NETSPLIT_LISTEN="+s.master.IP+":6380",
		"NETSPLIT_TARGET=127.0.0.1:6379", "NETSPLIT_DELAY="+(l.rtt/2).String(), "NETSPLIT_JITTER="+l.jitter.String(), os.Args[0])
	if l.loss > 0 {
		s.d.Lose(s.master, l.loss)
	}
	args := []string{"--listen", "127.0.0.1:8080", "--store", "redis://" + s.master.IP + ":6380", "--log-level", "warn",
		"--redis-replica-acks", "1"}
	if l.pipelines > 0 {
		args = append(args, "--redis-pipelines", strconv.Itoa(l.pipelines))
	}
	s.idemd = s.d.Start(bin, args...)
	if out, err := helper(s.d, "ready").CombinedOutput(); err != nil {
		t.Fatalf("the daemon is not ready: %v: %s\n%s\n%s", err, out, s.idemd.Output(), s.relay.Output())
	}
	return s
}

// slowRun is what a load saw through a slow link.
type slowRun struct {
	calls, answered, refused, completions int
	seconds                               float64
	p50, p99                              time.Duration // of the calls answered
	cpu                                   map[string]time.Duration
	history                               porcupine.CheckResult
	lost, twice                           int
}

// runSlow runs claim-and-complete cycles from that many clients through the daemon for
// d, then checks the history and every acknowledged completion.
func runSlow(t testing.TB, s *slowLab, clients int, d time.Duration) slowRun {
	loads, histories := startLoads(t, clients, s.d)
	procs := map[string]*netsplit.Proc{"idemd": s.idemd, "redis": s.redis, "relay": s.relay, "load": loads[0]}
	cpu := func() map[string]time.Duration {
		names := []string{"idemd", "redis", "relay", "load"}
		pids := make([]int, len(names))
		for i, n := range names {
			pids[i] = procs[n].Pid()
		}
		times, err := appbench.CPUTimes(pids)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]time.Duration{}
		for i, n := range names {
			out[n] = times[i]
		}
		return out
	}
	// The load's first calls open its connections; measure from its first answer on.
	if err := wait.Until(30*time.Second, func() error {
		if !strings.Contains(loads[0].Output(), "completed") {
			return fmt.Errorf("no completion yet:\n%.2000s", loads[0].Output())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	from, cpuFrom := monotonic(), cpu()
	window := time.NewTimer(d)
	<-window.C
	to, cpuTo := monotonic(), cpu()
	stopLoads(t, []*netsplit.Proc{loads[0]})

	var r slowRun
	r.seconds = time.Duration(to - from).Seconds()
	r.cpu = map[string]time.Duration{}
	for n, v := range cpuTo {
		r.cpu[n] = v - cpuFrom[n]
	}
	var took []time.Duration
	b, err := os.ReadFile(histories[0])
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		var c lintest.Call
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("%s: %v", histories[0], err)
		}
		if c.Start < from || c.End > to {
			continue
		}
		r.calls++
		switch {
		case c.Out != lintest.OutUnknown:
			r.answered++
			took = append(took, time.Duration(c.End-c.Start))
			if c.Op == lintest.OpComplete && c.Out == lintest.OutOK {
				r.completions++
			}
		default:
			r.refused++
		}
	}
	slices.Sort(took)
	if len(took) > 0 {
		r.p50, r.p99 = took[len(took)/2], took[len(took)*99/100]
	}
	res := collect(loads[0].Output())
	for _, n := range res.acquired {
		if n > 1 {
			r.twice++
		}
	}
	var looked string
	r.lost, _, looked = verifyAcked(t, s.d, res.acked)
	r.history = checkHistories(t, append(histories, looked), true)
	return r
}

// TestSlowLossyLink runs 32 clients through a daemon whose way to Redis is 50 ms
// longer, with 10 ms of jitter, and drops 1 % of its packets: the calls are slower,
// and nothing else changes. The history is linearizable, every acknowledged
// completion is there, and no key is acquired twice.
func TestSlowLossyLink(t *testing.T) {
	l := link{rtt: 50 * time.Millisecond, jitter: 10 * time.Millisecond, loss: 0.01}
	r := runSlow(t, startSlowLab(t, l), 32, 10*time.Second)
	t.Logf("%s: %d calls in %.1f s, %d answered, %d not (503 or no answer), %d completions; p50 %s, p99 %s; history %s",
		l, r.calls, r.seconds, r.answered, r.refused, r.completions, r.p50, r.p99, r.history)
	if r.completions == 0 {
		t.Fatal("no completion was acknowledged: the load tested nothing")
	}
	if r.history != porcupine.Ok {
		t.Errorf("the history is %s", r.history)
	}
	if r.lost > 0 || r.twice > 0 {
		t.Errorf("%d acknowledged completions lost, %d keys acquired twice", r.lost, r.twice)
	}
}

// BenchmarkSlowLink measures what a longer and lossy way to Redis costs 32 clients:
// completed cycles per second, the median and 99th percentile of a call, the share of
// calls answered 503, and the CPU each process spends per cycle, for each link against
// the first (the relay with no delay), in one run. Each link runs for
// IDEMD_SLOWLINK_SECONDS (15 by default), whatever b.N is:
//
//	go test -run XXX -bench SlowLink -benchtime 1x ./internal/testing/netsplit/
func BenchmarkSlowLink(b *testing.B) {
	seconds := 15
	if v, err := strconv.Atoi(os.Getenv("IDEMD_SLOWLINK_SECONDS")); err == nil && v > 0 {
		seconds = v
	}
	clients := 32
	if v, err := strconv.Atoi(os.Getenv("IDEMD_SLOWLINK_CLIENTS")); err == nil && v > 0 {
		clients = v
	}
	var base float64
	for _, l := range []link{
		{},
		{rtt: 50 * time.Millisecond},
		{rtt: 200 * time.Millisecond},
		{rtt: 200 * time.Millisecond, pipelines: 8},
		{loss: 0.01},
		{rtt: 50 * time.Millisecond, jitter: 10 * time.Millisecond, loss: 0.01},
		{rtt: 200 * time.Millisecond, jitter: 20 * time.Millisecond, loss: 0.01},
	} {
		b.Run(l.String(), func(b *testing.B) {
			r := runSlow(b, startSlowLab(b, l), clients, time.Duration(seconds)*time.Second)
			cycles := float64(r.completions) / r.seconds
			if l == (link{}) {
				base = cycles
			}
			b.ReportMetric(cycles, "cycles/s")
			if base > 0 {
				b.ReportMetric(cycles/base, "x-baseline")
			}
			b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(100*float64(r.refused)/float64(max(r.calls, 1)), "%503")
			for _, n := range []string{"idemd", "redis", "relay", "load"} {
				b.ReportMetric(float64(r.cpu[n].Microseconds())/float64(max(r.completions, 1)), n+"-cpu-us/cycle")
			}
			if r.history != porcupine.Ok || r.lost > 0 || r.twice > 0 {
				b.Errorf("history %s, %d acknowledged completions lost, %d keys acquired twice", r.history, r.lost, r.twice)
			}
		})
	}
}
