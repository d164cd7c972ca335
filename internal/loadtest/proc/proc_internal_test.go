package proc

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestParseStat: utime and stime are read after the command name, which may hold
// spaces and parentheses of its own.
func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat   string
		utime, stime int64
	}{
		{"plain", "27656 (cat) R 27652 27652 20280 0 -1 4194304 102 0 0 0 17 4 0 0 20 0 1 0 111876 3133440 414", 17, 4},
		{"spaces and parentheses in the name", "42 (a (b) c) S 1 42 42 0 -1 4194560 5 0 0 0 1234 567 0 0 20 0 9 0 100 0 0", 1234, 567},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, s, err := parseStat([]byte(tc.stat))
			if err != nil || u != tc.utime || s != tc.stime {
				t.Fatalf("parseStat = %d, %d, %v; want %d, %d", u, s, err, tc.utime, tc.stime)
			}
		})
	}
	for _, bad := range []string{"", "1 (x) R 1 2 3", "1 (x) R 1 1 1 0 -1 0 0 0 0 0 u 4 0"} {
		if _, _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

// TestParseStatus: VmRSS and VmHWM are read in kB and given in bytes; a status
// without them is an error.
func TestParseStatus(t *testing.T) {
	status := "Name:\tidemd\nVmPeak:\t 1300 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nThreads:\t9\n"
	rss, hwm, err := parseStatus([]byte(status))
	if err != nil || rss != 1<<20 || hwm != 2<<20 {
		t.Fatalf("parseStatus = %d, %d, %v; want %d, %d", rss, hwm, err, 1<<20, 2<<20)
	}
	for _, bad := range []string{"", "Name:\tkthreadd\nThreads:\t1\n", "VmRSS:\t 1024 kB\n", "VmHWM:\t 2048 kB\n"} {
		if _, _, err := parseStatus([]byte(bad)); err == nil {
			t.Errorf("parseStatus(%q): no error", bad)
		}
	}
}

// TestParseLoadavg: the first n load averages, or "?" when there are fewer.
func TestParseLoadavg(t *testing.T) {
	loadavg := []byte("0.52 0.41 0.30 2/345 12345\n")
	for n, want := range map[int]string{0: "?", 1: "0.52", 3: "0.52 0.41 0.30"} {
		if got := parseLoadavg(loadavg, n); got != want {
			t.Errorf("parseLoadavg(%d) = %q, want %q", n, got, want)
		}
	}
	if got := parseLoadavg([]byte("0.52\n"), 3); got != "?" {
		t.Errorf("three of one load average: %q, want ?", got)
	}
}

// TestCPUGrows: the CPU this process spends shows in its /proc stat.
func TestCPUGrows(t *testing.T) {
	before, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has counted at least two ticks more, whatever the machine's speed.
	deadline := time.Now().Add(time.Minute)
	var after time.Duration
	for after < before+2*ClockTick && time.Now().Before(deadline) {
		x := 0
		for i := range 1_000_000 {
			x += i
		}
		_ = x
		if after, err = CPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after < before+2*ClockTick {
		t.Fatalf("CPU %s after a minute of spinning, %s before", after, before)
	}
}

// TestMemoryOfThisProcess: this process has a resident set, and its peak is at least that.
func TestMemoryOfThisProcess(t *testing.T) {
	rss, hwm, err := Memory(os.Getpid())
	if err != nil || rss <= 0 || hwm < rss {
		t.Fatalf("Memory = %d, %d, %v", rss, hwm, err)
	}
}

// TestWaitNoticesExit: waiting on a child that exits ends with its output, not at
// the deadline; a group's Stop ends a child still running.
func TestWaitNoticesExit(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	var g Group
	defer g.Stop(10 * time.Second)
	quitter, err := g.Start("quitter", t.TempDir(), sh, "-c", "echo gone; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	err = WaitWithin(context.Background(), 10*time.Minute, quitter, "never", func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "quitter exited: gone") {
		t.Fatalf("waiting on a child that exits: %v", err)
	}
	sleeper, err := g.Start("sleeper", "", sh, "-c", "exec sleep 600")
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitWithin(context.Background(), time.Minute, sleeper, "started", func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	g.Stop(10 * time.Second)
	select {
	case <-sleeper.Done():
	default:
		t.Fatal("the sleeper runs after the group's Stop")
	}
}
