package floorbench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/loadtest/proc"
)

// TestSampleArithmetic: per cycle figures are in microseconds per successful cycle,
// and the comparison with the floor is round by round.
func TestSampleArithmetic(t *testing.T) {
	s := sample{cycles: 4000, elapsed: 2 * time.Second, server: 800 * time.Millisecond, redis: 240 * time.Millisecond}
	if got := s.rate(); got != 2000 {
		t.Errorf("rate %v, want 2000", got)
	}
	if got := s.perCycle(s.server); got != 200 {
		t.Errorf("server per cycle %v µs, want 200", got)
	}
	if got := s.perCycle(s.redis); got != 60 {
		t.Errorf("Redis per cycle %v µs, want 60", got)
	}
	if got := (sample{}).perCycle(time.Second); got != 0 {
		t.Errorf("per cycle of no cycles %v, want 0", got)
	}
	// Round by round: 1/2 and 3/2, not the spread of one over the spread of the other.
	if got := spanOf(ratios([]float64{100, 300}, []float64{200, 200})); got != (span{0.5, 1.5}) {
		t.Errorf("ratios %v, want 0.5 – 1.5", got)
	}
	if got := spanOf(differences([]float64{150, 120}, []float64{100, 100})); got != (span{20, 50}) {
		t.Errorf("differences %v, want 20 – 50", got)
	}
	if got := (span{3.004, 3.001}).format("%.2f"); got != "3.00" {
		t.Errorf("a span whose ends print alike: %q", got)
	}
	if got := (span{1, 2}).format("%.2f×"); got != "1.00× – 2.00×" {
		t.Errorf("span: %q", got)
	}
}

// TestPrintSummary: the table compares each target with the first, the floor.
func TestPrintSummary(t *testing.T) {
	floor := &target{name: "floor", title: "floor", redis: []*proc.Process{{}}}
	idemd := &target{name: "redis", title: "idemd, Redis", redis: []*proc.Process{{}}}
	results := map[string][]sample{
		"floor": {{cycles: 1000, elapsed: time.Second, claimP50: 100 * time.Microsecond, server: 200 * time.Millisecond, redis: 50 * time.Millisecond}},
		"redis": {{cycles: 800, elapsed: time.Second, claimP50: 150 * time.Microsecond, server: 240 * time.Millisecond, redis: 80 * time.Millisecond}},
	}
	var out bytes.Buffer
	printSummary(&out, 32, []*target{floor, idemd}, results)
	for _, want := range []string{
		"| floor | 1000 | 100 |",
		"| idemd, Redis | 800 | 150 |",
		"| idemd, Redis | 0.80× | +50 µs | 1.50× | 2.00× |", // 300 µs against 200; 100 against 50
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}

// TestSlotRanges: the masters of a cluster share the 16384 slots with none left over
// and none twice.
func TestSlotRanges(t *testing.T) {
	for n := 1; n <= 5; n++ {
		next := 0
		for i := range n {
			lo, hi := slotRange(i, n)
			if lo != next || hi < lo {
				t.Fatalf("%d masters: master %d has %d – %d, want it to start at %d", n, i, lo, hi, next)
			}
			next = hi + 1
		}
		if next != 16384 {
			t.Fatalf("%d masters: the slots end at %d", n, next-1)
		}
	}
}

// TestClusterModel: a master's CPU per cycle it served is its CPU over its share of
// the cycles, and the cluster's capacity is set by its busiest master.
func TestClusterModel(t *testing.T) {
	s := clusterSample{masters: 2, cycles: 10000, elapsed: 2 * time.Second,
		masterCPU:  []time.Duration{300 * time.Millisecond, 200 * time.Millisecond},
		masterCmds: []int64{6000, 4000}, masterReads: []int64{1000, 2000},
		daemonCPU: []time.Duration{600 * time.Millisecond, 400 * time.Millisecond}, daemonCycles: []int{6000, 4000}}
	if got := s.masterPerServed(0); got != 50 { // 300 ms over 6000 cycles
		t.Errorf("master 0: %v µs per cycle it served, want 50", got)
	}
	if got := s.masterPerServed(1); got != 50 {
		t.Errorf("master 1: %v µs per cycle it served, want 50", got)
	}
	if got := s.callsPerRead(1); got != 2 {
		t.Errorf("master 1: %v calls a read, want 2", got)
	}
	if got := s.daemonPerServed(0); got != 100 {
		t.Errorf("daemon 0: %v µs per cycle, want 100", got)
	}
	m := modelOf([]clusterSample{s})
	// The busiest master spends 30 µs per cycle of the run: 1 s / 30 µs.
	if want := 1e6 / 30; m.capacity.lo < want-1e-6 || m.capacity.hi > want+1e-6 {
		t.Errorf("capacity %v, want %.0f", m.capacity, want)
	}
	// The daemons spend 100 µs per cycle: at 33333 cycles/s, 3.3 cores.
	if m.daemonCoresAtCap.lo < 3.33 || m.daemonCoresAtCap.hi > 3.34 {
		t.Errorf("daemon cores %v, want 3.33", m.daemonCoresAtCap)
	}
	if m.share != (span{0.4, 0.6}) {
		t.Errorf("shares %v, want 0.4 – 0.6", m.share)
	}
}
