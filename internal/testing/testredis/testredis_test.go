package testredis

import (
	"errors"
	"testing"
)

// TestTakenPortIsNotShared: a server whose port another redis-server holds is not
// taken for ready because something answers PING there; it reports the port taken,
// and Start would try another.
func TestTakenPortIsNotShared(t *testing.T) {
	first := Start(t)
	second := &Server{t: t, Port: first.Port, Dir: t.TempDir()}
	err := second.launch()
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("a second server on the port of the first: %v, want errPortTaken", err)
	}
	if pid, err := serverPID(first.Addr()); err != nil || pid != first.cmd.Process.Pid {
		t.Fatalf("the first server: process %d (%v), want %d", pid, err, first.cmd.Process.Pid)
	}
}
