// Package wait is how tests wait for something to happen: they poll a condition until it
// holds or a deadline passes, never sleep for a guessed time.
package wait

import (
	"fmt"
	"testing"
	"time"
)

// Until calls check until it returns nil, pausing a little longer each time (up to
// 50 ms), and returns check's last error once timeout has passed.
func Until(timeout time.Duration, check func() error) error {
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

// For fails the test unless cond holds within timeout; what names the condition.
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
