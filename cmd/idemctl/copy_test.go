package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// ownDaemon runs idemd until stop is called (or the test ends), and returns its URL.
func ownDaemon(t *testing.T, flags ...string) (base string, stop func()) {
	t.Helper()
	return ownDaemonAt(t, testdaemon.FreeAddr(t), flags...)
}

// ownDaemonAt is ownDaemon listening on addr.
func ownDaemonAt(t *testing.T, addr string, flags ...string) (base string, stop func()) {
	t.Helper()
	logs := &testdaemon.Logs{}
	cmd := exec.Command(binaries.idemd, append([]string{"--listen", addr, "--log-level", "warn"}, flags...)...)
	cmd.Env = testdaemon.Env()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}
	t.Cleanup(stop)
	base = "http://" + addr
	wait.For(t, 30*time.Second, "idemd to be ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("idemd exited:\n%s", logs)
		default:
		}
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base, stop
}

// TestCopyEmbeddedToRedis moves a daemon from its embedded store to Redis with idemctl
// copy, killed once mid-way and run again: every completion replays byte for byte from
// Redis, the lease taken before the move completes after it with its own token, the
// key left released resumes from its recovery point, and nothing is acquired twice.
func TestCopyEmbeddedToRedis(t *testing.T) {
	dataDir := t.TempDir()
	db := filepath.Join(dataDir, boltstore.DatabaseFile)
	base, stop := ownDaemon(t, "--data-dir", dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client, err := idem.New(base, idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	const completed = 200
	for i := range completed {
		if _, err := client.Do(ctx, fmt.Sprintf("done-%d", i), "", func(context.Context) (idem.Response, error) {
			return idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	held := idemctl(map[string]string{"IDEMD_URL": base}, "claim", "held", "--lease", "10m", "--json")
	expect(t, held, exitOK, "claim of the key held across the move")
	lease := held.json(t)["lease_token"].(string)
	half := idemctl(map[string]string{"IDEMD_URL": base}, "claim", "half", "--json")
	expect(t, half, exitOK, "claim of the key left released")
	halfLease := half.json(t)["lease_token"].(string)
	if err := client.RecordRecoveryPoint(ctx, "half", halfLease, "charged", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	expect(t, idemctl(map[string]string{"IDEMD_URL": base}, "release", "half", "--lease-token", halfLease), exitOK, "release")

	srv := testredis.Start(t)
	r := idemctl(nil, "copy", "--from", "bolt://"+db, "--to", srv.URL())
	expect(t, r, exitUnavailable, "copy while idemd serves the file")
	if !strings.Contains(r.stderr, "stop the idemd") {
		t.Fatalf("copy while idemd serves the file: %s", r.stderr)
	}
	stop()

	// Enough records that the copy is killed mid-way.
	const bulk = 20000
	fill, err := boltstore.Open(db, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	now := time.Now()
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < bulk; i += 32 {
				e := engine.Exported{KeyDigest: engine.KeyDigest(fmt.Sprintf("bulk-%d", i))}
				e.ID = engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("bulk-%d", i)}
				e.State, e.Attempt, e.LeaseToken = engine.StateCompleted, 1, engine.NewLeaseToken()
				e.CreatedAt, e.UpdatedAt, e.ExpiresAt = now, now, now.Add(time.Hour)
				e.Response = &engine.Response{Status: 200, Body: []byte(fmt.Sprint(i))}
				if _, err := fill.Import(ctx, e); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := fill.Close(); err != nil {
		t.Fatal(err)
	}
	total := int64(bulk + completed + 2)

	// Killed once something is copied, then run again.
	cmd := exec.Command(binaries.idemctl, "copy", "--from", "bolt://"+db, "--to", srv.URL(), "--progress", "10ms")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var progress string
	for sc.Scan() {
		if progress = sc.Text(); strings.HasPrefix(progress, "copied ") && !strings.HasPrefix(progress, "copied 0 ") {
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	t.Logf("killed at: %s", progress)
	var left int64
	if _, after, ok := strings.Cut(progress, "about "); !ok {
		t.Fatalf("the progress says nothing of what is left: %s", progress)
	} else if _, err := fmt.Sscanf(after, "%d left", &left); err != nil || left <= 0 || left >= total {
		t.Fatalf("the progress before the end says %d left of %d: %s", left, total, progress)
	}

	var out bytes.Buffer
	again := exec.Command(binaries.idemctl, "copy", "--from", "bolt://"+db, "--to", srv.URL(), "--json")
	again.Stdout = &out
	if err := again.Run(); err != nil {
		t.Fatalf("copy run again: %v\n%s", err, out.String())
	}
	var sum struct{ Read, Written, Same, Kept, Expired int64 }
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Read != total || sum.Written+sum.Same != total || sum.Same == 0 || sum.Kept != 0 {
		t.Fatalf("copy run again: %+v, want %d records read, the ones the killed run wrote found the same", sum, total)
	}

	// The daemon serves from Redis alone.
	onRedis, stopRedis := ownDaemon(t, "--store", srv.URL())
	rc, err := idem.New(onRedis, idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Claim(ctx, "held", idem.ClaimOptions{}); err == nil || !strings.Contains(err.Error(), "in_progress") {
		t.Fatalf("claim of the key held across the move: %v, want in progress", err)
	}
	expect(t, idemctl(map[string]string{"IDEMD_URL": onRedis}, "complete", "held", "--lease-token", lease, "--body", "after"), exitOK,
		"complete after the move with the lease taken before it")
	for i := range completed {
		rec, err := rc.Lookup(ctx, fmt.Sprintf("done-%d", i))
		if err != nil || rec.Response == nil || string(rec.Response.Body) != fmt.Sprintf(`{"n":%d}`, i) ||
			rec.Response.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("replay of done-%d from Redis: %+v, %v", i, rec, err)
		}
	}
	for _, i := range []int{0, bulk / 2, bulk - 1} {
		if rec, err := rc.Lookup(ctx, fmt.Sprintf("bulk-%d", i)); err != nil || string(rec.Response.Body) != fmt.Sprint(i) {
			t.Fatalf("bulk-%d from Redis: %+v, %v", i, rec, err)
		}
	}
	res, err := rc.Claim(ctx, "half", idem.ClaimOptions{})
	if err != nil || res.Outcome != idem.Acquired || res.Attempt != 2 || res.RecoveryPoint == nil || string(res.RecoveryPoint.Data) != "ch_1" {
		t.Fatalf("claim of the released key after the move: %+v, %v", res, err)
	}

	// Rolled back into a file of its own, the held key keeps its completion.
	back := filepath.Join(t.TempDir(), "back", "idemd.db")
	r = idemctl(nil, "copy", "--from", srv.URL(), "--to", "bolt://"+back)
	expect(t, r, exitUnavailable, "copy back while a daemon serves Redis")
	stopRedis()
	r = idemctl(nil, "copy", "--from", srv.URL(), "--to", "bolt://"+back, "--json")
	expect(t, r, exitOK, "copy back")
	if out := r.json(t); out["written"] != float64(total) {
		t.Fatalf("copy back: %v, want %d written", out, total)
	}
	rolledBack, _ := ownDaemon(t, "--store", "bolt://"+back)
	r = idemctl(map[string]string{"IDEMD_URL": rolledBack}, "lookup", "held", "--json")
	expect(t, r, exitOK, "lookup after the rollback")
	if out := r.json(t); out["state"] != "completed" {
		t.Fatalf("the key completed on Redis, after the rollback: %v", out)
	}
}

// TestCopyRedisToCluster moves a deployment from a standalone Redis onto a Cluster:
// the copy refuses while a daemon is connected to the old Redis, and once it is
// stopped, a lease taken before the move completes on the Cluster with its own token
// and results replay from it.
func TestCopyRedisToCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster takes long to start")
	}
	srv := testredis.Start(t)
	base, stop := ownDaemon(t, "--store", srv.URL(), "--redis-record-layout", "strings")
	env := map[string]string{"IDEMD_URL": base}
	r := idemctl(env, "claim", "held", "--lease", "10m", "--json")
	expect(t, r, exitOK, "claim")
	lease := r.json(t)["lease_token"].(string)
	r = idemctl(env, "claim", "done", "--json")
	expect(t, r, exitOK, "claim")
	expect(t, idemctl(env, "complete", "done", "--lease-token", r.json(t)["lease_token"].(string), "--body", "result"), exitOK, "complete")

	cluster := testredis.StartCluster(t)
	r = idemctl(nil, "copy", "--from", srv.URL(), "--to", cluster.URL())
	expect(t, r, exitUnavailable, "copy while a daemon serves the old Redis")
	if !strings.Contains(r.stderr, "stop every daemon") {
		t.Fatalf("copy while a daemon serves the old Redis: %s", r.stderr)
	}
	stop()
	r = idemctl(nil, "copy", "--from", srv.URL(), "--to", cluster.URL(), "--json")
	expect(t, r, exitOK, "copy")
	if out := r.json(t); out["written"] != float64(2) {
		t.Fatalf("copy: %v", out)
	}
	onCluster, _ := ownDaemon(t, "--store", cluster.URL())
	env = map[string]string{"IDEMD_URL": onCluster}
	r = idemctl(env, "claim", "held")
	expect(t, r, exitRefused, "claim of the held key on the Cluster")
	if !strings.Contains(r.stderr, "in_progress") {
		t.Fatalf("claim of the held key on the Cluster: %s", r.stderr)
	}
	expect(t, idemctl(env, "complete", "held", "--lease-token", lease, "--body", "after"), exitOK, "complete on the Cluster with the lease taken before")
	r = idemctl(env, "claim", "done", "--json")
	expect(t, r, exitOK, "replay on the Cluster")
	if out := r.json(t); out["outcome"] != "completed" {
		t.Fatalf("replay on the Cluster: %v", out)
	}
}
