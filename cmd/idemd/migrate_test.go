package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testdaemon"
	"github.com/idemd/idemd/internal/testredis"
	"github.com/idemd/idemd/internal/wait"
)

// startWith runs the binary with flags, as startBinary does.
func startWith(t *testing.T, bin string, flags ...string) *process {
	t.Helper()
	addr := testdaemon.FreeAddr(t)
	p := &process{base: "http://" + addr, logs: &strings.Builder{}}
	p.cmd = exec.Command(bin, append([]string{"--listen", addr, "--data-dir", t.TempDir(), "--log-level", "info"}, flags...)...)
	p.cmd.Env = testdaemon.Env()
	p.cmd.Stdout, p.cmd.Stderr = &lockedWriter{w: p.logs}, &lockedWriter{w: p.logs}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	waitReady(t, p)
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *process) metric(t *testing.T, name string) string {
	t.Helper()
	resp, err := http.Get(p.base + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strings.TrimPrefix(line, name+" ")
		}
	}
	return ""
}

// TestMoveLiveBetweenRedis moves the records of one Redis into another while real
// daemons serve both: one still on the old Redis alone, a migrating one that is killed
// with SIGKILL half-way through its copy and started again. Concurrent clients claim
// through both the whole time: no key is acquired twice. A lease granted before the
// move is got back with its claim secret, extended and completed after it; and once
// the old Redis is stopped, a daemon of the new one alone replays every acknowledged
// completion byte for byte.
func TestMoveLiveBetweenRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis servers and daemons")
	}
	t.Parallel()
	bin := buildDaemon(t)
	t.Run("onto another Redis", func(t *testing.T) {
		t.Parallel()
		to := testredis.Start(t)
		moveLive(t, bin, to.URL())
	})
	t.Run("onto a Cluster", func(t *testing.T) {
		t.Parallel()
		to := testredis.StartCluster(t)
		moveLive(t, bin, to.URL())
	})
}

func moveLive(t *testing.T, bin, toURL string) {
	from := testredis.Start(t)

	// The records before the move, written straight into the old Redis.
	const before = 3000
	seed, err := redisstore.OpenWith(from.URL(), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := map[string]string{}
	var seedWG sync.WaitGroup
	var seedMu sync.Mutex
	for w := range 8 {
		seedWG.Go(func() {
			for i := w; i < before; i += 8 {
				id := engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("before-%d", i)}
				tok := engine.NewLeaseToken()
				if _, err := seed.Claim(ctx, engine.Claim{ID: id, Token: tok, Lease: time.Minute, Retention: time.Hour}); err != nil {
					t.Error(err)
					return
				}
				body := fmt.Sprintf("result of %d \x00\xff", i)
				if _, err := seed.Complete(ctx, engine.Completion{ID: id, LeaseToken: tok, Retention: time.Hour,
					Response: engine.Response{Status: 201, Body: []byte(body)}}); err != nil {
					t.Error(err)
					return
				}
				seedMu.Lock()
				want[id.Key] = body
				seedMu.Unlock()
			}
		})
	}
	seedWG.Wait()
	_ = seed.Close()
	if t.Failed() {
		t.FailNow()
	}

	plain := startWith(t, bin, "--store", from.URL())
	secret := "the held lease's claim secret, long enough"
	code, held := plain.call(t, "/v1/claim", map[string]any{"key": "held", "claim_secret": secret, "lease_ms": 60000})
	if code != 201 {
		t.Fatalf("claim before the move: %d %v", code, held)
	}
	heldToken := held["lease_token"].(string)

	migrating := startWith(t, bin, "--store", toURL, "--migrate-from", from.URL(), "--console")

	// Clients through both daemons, all along.
	stop := make(chan struct{})
	var mu sync.Mutex
	acquired := map[string]string{}
	var load sync.WaitGroup
	daemons := []func() *process{func() *process { return plain }, func() *process {
		mu.Lock()
		defer mu.Unlock()
		return migrating
	}}
	for w := range 4 {
		load.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := daemons[(w+i)%2]()
				key := fmt.Sprintf("live-%d", (i*7+w*13)%200)
				if i%3 == 0 {
					key = fmt.Sprintf("before-%d", (i*31+w)%before)
				}
				code, out := d.callQuiet("/v1/claim", map[string]any{"key": key, "lease_ms": 30000})
				if code != 201 {
					continue
				}
				mu.Lock()
				if by, twice := acquired[key]; twice {
					t.Errorf("%s acquired a second time (first by %s, now by %s)", key, by, d.base)
				}
				acquired[key] = d.base
				mu.Unlock()
				body := "done by " + d.base
				for try := 0; try < 50; try++ {
					// A daemon of the old store answers store_moved once the key moved:
					// the client goes to the other.
					c, _ := daemons[(w+i+try)%2]().callQuiet("/v1/complete", map[string]any{"key": key, "lease_token": out["lease_token"],
						"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString([]byte(body))}})
					if c == 200 {
						mu.Lock()
						want[key] = body
						mu.Unlock()
						break
					}
				}
			}
		})
	}

	// SIGKILL the migrating daemon half-way through its copy, and start it again.
	wait.For(t, 60*time.Second, "the copier to hand keys over", func() bool {
		v := migrating.metric(t, "idemd_migration_keys_handed_over")
		return v != "" && v != "0"
	})
	if migrating.metric(t, "idemd_migration_done") == "1" {
		t.Log("the copier finished before the kill")
	}
	mu.Lock()
	migrating.kill(t)
	mu.Unlock()
	restarted := startWith(t, bin, "--store", toURL, "--migrate-from", from.URL(), "--console")
	mu.Lock()
	migrating = restarted
	mu.Unlock()
	// Not done while a daemon serves the old store alone: it may still write there.
	wait.For(t, 120*time.Second, "the copier to find nothing left but the old store's own daemon", func() bool {
		v := restarted.metric(t, "idemd_migration_alone_daemons")
		return v != "" && v != "0"
	})
	if restarted.metric(t, "idemd_migration_done") == "1" {
		t.Fatal("the copier is done while a daemon serves the old store alone")
	}
	close(stop)
	load.Wait()
	code, held2 := plain.call(t, "/v1/claim", map[string]any{"key": "held", "claim_secret": secret})
	if code != 503 || held2["code"] != "store_moved" {
		t.Fatalf("the old store's daemon on a moved key: %d %v", code, held2)
	}
	plain.kill(t)
	wait.For(t, 120*time.Second, "the copier to finish", func() bool {
		return restarted.metric(t, "idemd_migration_done") == "1"
	})
	var view struct {
		Migration *struct {
			From       string `json:"from"`
			HandedOver int64  `json:"handed_over"`
			Left       int64  `json:"left"`
			Done       bool   `json:"done"`
		} `json:"migration"`
	}
	resp, err := http.Get(restarted.base + "/console/api/store")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&view)
	resp.Body.Close()
	if err != nil || view.Migration == nil || !view.Migration.Done || view.Migration.Left != 0 || view.Migration.From == "" {
		t.Fatalf("the store view once the copier is done: %+v %v", view.Migration, err)
	}

	// The lease granted before the move, after it.
	code, again := restarted.call(t, "/v1/claim", map[string]any{"key": "held", "claim_secret": secret})
	if code != 201 || again["lease_token"] != heldToken {
		t.Fatalf("the held lease's claim resent with its secret after the move: %d %v", code, again)
	}
	if code, out := restarted.call(t, "/v1/extend", map[string]any{"key": "held", "lease_token": heldToken, "lease_ms": 60000}); code != 200 {
		t.Fatalf("extend after the move: %d %v", code, out)
	}
	if code, out := restarted.call(t, "/v1/complete", map[string]any{"key": "held", "lease_token": heldToken,
		"response": map[string]any{"status": 200, "body": base64.StdEncoding.EncodeToString([]byte("held, done"))}}); code != 200 {
		t.Fatalf("complete after the move: %d %v", code, out)
	}
	want["held"] = "held, done"

	// Retire the old Redis: the new one alone replays everything acknowledged.
	restarted.kill(t)
	from.Stop()
	alone := startWith(t, bin, "--store", toURL)
	for key, body := range want {
		code, out := alone.call(t, "/v1/claim", map[string]any{"key": key})
		resp, _ := out["response"].(map[string]any)
		got, _ := base64.StdEncoding.DecodeString(fmt.Sprint(resp["body"]))
		if code != 200 || string(got) != body {
			t.Fatalf("%s from the new Redis alone: %d %v, want %q", key, code, out, body)
		}
	}
	t.Logf("%d completions replayed from the new store; %d keys acquired during the move", len(want), len(acquired))
}

// callQuiet is call without failing the test on a connection error (a killed daemon).
func (p *process) callQuiet(path string, body any) (int, map[string]any) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(p.base+path, "application/json", strings.NewReader(string(b)))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}
