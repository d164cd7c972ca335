package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/testredis"
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
