package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// TestLiveMoveEmbeddedToRedis moves a daemon's embedded store into Redis live: the
// daemon is restarted with --store redis://… --migrate-from bolt://…, idemctl
// migration status follows its copier to done, the lease taken before the move is
// completed after it with its own token, and a daemon of Redis alone then replays every
// completion byte for byte.
func TestLiveMoveEmbeddedToRedis(t *testing.T) {
	dataDir := t.TempDir()
	db := filepath.Join(dataDir, boltstore.DatabaseFile)
	base, stop := ownDaemon(t, "--data-dir", dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client, err := idem.New(base, idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	const completed = 300
	for i := range completed {
		if _, err := client.Do(ctx, fmt.Sprintf("done-%d", i), "", func(context.Context) (idem.Response, error) {
			return idem.Response{Status: 201, Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	held := idemctl(map[string]string{"IDEMD_URL": base}, "claim", "held", "--lease", "10m", "--json")
	expect(t, held, exitOK, "claim of the key held across the move")
	lease := held.json(t)["lease_token"].(string)

	// The daemon is restarted on the same address as a migrating one, while a client
	// calls it in a loop: the move's cost is the time with no answer, from the old
	// process's last to the new one's first.
	srv := testredis.Start(t)
	gap := measureRestart(t, base, stop, func() (string, func()) {
		return ownDaemonAt(t, strings.TrimPrefix(base, "http://"),
			"--data-dir", t.TempDir(), "--store", srv.URL(), "--migrate-from", "bolt://"+db, "--console")
	})
	moving, stopMoving := gap.base, gap.stop
	env := map[string]string{"IDEMD_URL": moving}
	var last result
	wait.For(t, 60*time.Second, "the copier to be done", func() bool {
		last = idemctl(env, "migration", "status")
		return last.code == exitOK && strings.Contains(last.stdout, "done")
	})
	if !strings.Contains(last.stdout, "bolt://") || !strings.Contains(last.stdout, "only markers") {
		t.Fatalf("migration status once done: %s", last.stdout)
	}
	js := idemctl(env, "migration", "status", "--json")
	expect(t, js, exitOK, "migration status --json")
	if out := js.json(t); out["done"] != true || out["left"] != float64(0) {
		t.Fatalf("migration status --json: %v", out)
	}
	expect(t, idemctl(env, "complete", "held", "--lease-token", lease, "--status", "200", "--body", "held, done"), exitOK,
		"completing the lease taken before the move")
	stopMoving()

	alone, _ := ownDaemon(t, "--data-dir", t.TempDir(), "--store", srv.URL())
	c2, err := idem.New(alone, idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	for i := range completed {
		res, err := c2.Do(ctx, fmt.Sprintf("done-%d", i), "", func(context.Context) (idem.Response, error) {
			t.Fatalf("done-%d ran again after the move", i)
			return idem.Response{}, nil
		})
		if err != nil || res.Status != http.StatusCreated || string(res.Body) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("done-%d from Redis alone: %+v %v", i, res, err)
		}
	}
	r := idemctl(map[string]string{"IDEMD_URL": alone}, "lookup", "held", "--json")
	expect(t, r, exitOK, "lookup of the key held across the move")
	if out := r.json(t); out["state"] != "completed" {
		t.Fatalf("the key held across the move: %v", out)
	}
}

// restart is a daemon restarted by measureRestart.
type restart struct {
	base string
	stop func()
}

// measureRestart stops the daemon at base and starts another on the same address,
// while a client claims a completed key there in a loop, and reports how long the
// client got no answer: from the last answer of the old process (before stop returned)
// to the first of the new one.
func measureRestart(t *testing.T, base string, stop func(), start func() (string, func())) restart {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	answered := func() (sent, at time.Time, ok bool) {
		sent = time.Now()
		resp, err := client.Post(base+"/v1/claim", "application/json", strings.NewReader(`{"key":"done-0"}`))
		if err != nil {
			return sent, time.Time{}, false
		}
		resp.Body.Close()
		return sent, time.Now(), resp.StatusCode == http.StatusOK
	}
	var stoppedAt, lastOldAt atomic.Int64
	var lastOld, firstNew time.Time
	var calls int
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(3 * time.Minute)
		for ; calls < 10_000_000 && time.Now().Before(deadline); calls++ {
			sent, at, ok := answered()
			if !ok {
				continue
			}
			// Sent once the old process had exited: the new one answered.
			if s := stoppedAt.Load(); s == 0 || sent.UnixNano() <= s {
				lastOld = at
				lastOldAt.Store(at.UnixNano())
				continue
			}
			firstNew = at
			return
		}
	}()
	wait.For(t, 30*time.Second, "the client to be answered before the restart", func() bool {
		return lastOldAt.Load() != 0
	})
	stop()
	stopped := time.Now()
	stoppedAt.Store(stopped.UnixNano())
	newBase, newStop := start()
	started := time.Now()
	<-done
	if lastOld.IsZero() || firstNew.IsZero() {
		t.Fatalf("the client calling in a loop: last answer of the old daemon %v, first of the new %v (%d calls)", lastOld, firstNew, calls)
	}
	t.Logf("restarting the daemon as a migrating one: no answer for %v (the old one stopped in %v, the new one was ready %v later; %d calls)",
		firstNew.Sub(lastOld).Round(time.Millisecond), stopped.Sub(lastOld).Round(time.Millisecond),
		started.Sub(stopped).Round(time.Millisecond), calls)
	return restart{base: newBase, stop: newStop}
}
