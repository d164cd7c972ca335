// Package wait is how tests wait for something to happen: they poll a condition until it
// holds or a deadline passes, never sleep for a guessed time.
//
// Every deadline a test gives for a condition is multiplied by the slowdown factor
// IDEMD_TEST_SLOWDOWN (3 unless set), so the deadlines written in the tests are what an
// ordinary machine needs, and a slow or busy machine, or the race detector, still gets
// its condition in time. A condition that holds ends the wait at once, so a large factor
// only makes a failing test slower to fail.
package wait

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// DefaultSlowdown is the factor deadlines are multiplied by when IDEMD_TEST_SLOWDOWN
// is not set.
const DefaultSlowdown = 3

var slowdown = parseSlowdown(os.Getenv("IDEMD_TEST_SLOWDOWN"))

// parseSlowdown reads the factor; a value that is not a positive number is a mistake
// the tests should not hide, so it panics.
func parseSlowdown(v string) float64 {
	if v == "" {
		return DefaultSlowdown
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) {
		panic(fmt.Sprintf("IDEMD_TEST_SLOWDOWN=%q: want a positive number", v))
	}
	return f
}

// Scale is d multiplied by the slowdown factor: the deadline for a condition, or for
// work, that a test would give d on an ordinary machine. Lease lengths, timeouts under
// test and other durations a test depends on are never scaled.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * slowdown)
}

// Until calls check until it returns nil, pausing a little longer each time (up to
// 50 ms), and returns check's last error once Scale(timeout) has passed.
func Until(timeout time.Duration, check func() error) error {
	timeout = Scale(timeout)
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		time.Sleep(pause)
	}
}

// For fails the test unless cond holds within Scale(timeout); what names the condition.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Until(timeout, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("waiting for %s", what)
	})
	if err != nil {
		t.Fatal(err)
	}
}
