package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// TestNotifierWatchAfterClose: once closed, the notifier makes no pub/sub connection
// and starts no receiving goroutine for a late watch, which would live on unowned.
func TestNotifierWatchAfterClose(t *testing.T) {
	srv := testredis.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	n := newNotifier(singleClient{client})
	w, err := n.watch(t.Context(), "first")
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	n.close()
	if w, err := n.watch(t.Context(), "late"); err == nil {
		w.Close()
		t.Fatal("watch after close succeeded")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.subs) != 0 {
		t.Fatal("watch after close made a new pub/sub connection")
	}
}

// TestWatchConfirmedLateWakesItsWaiter: a watch that returns before Redis confirms its
// subscription may have missed a notification sent in between; the confirmation, when
// it comes, wakes it so that its waiter looks at the record again. A watch confirmed
// in time starts with nothing pending.
func TestWatchConfirmedLateWakesItsWaiter(t *testing.T) {
	srv := testredis.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	n := newNotifier(singleClient{client})
	t.Cleanup(n.close)

	first, err := n.watch(t.Context(), "in-time")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	select {
	case <-first.C():
		t.Fatal("a watch confirmed before it returned starts with a wake-up pending")
	default:
	}

	n.subscribeWait = 50 * time.Millisecond
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	late, err := n.watch(t.Context(), "late")
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	srv.Resume()
	resumed = true
	select {
	case <-late.C():
	case <-time.After(wait.Scale(10 * time.Second)):
		t.Fatal("the confirmation of a late subscription did not wake its watcher in time")
	}
}
