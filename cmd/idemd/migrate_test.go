package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
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
// move is got back with its claim secret, extended and completed after it. Every
// refusal a client meets is a documented one, each client is served again after the
// restart, and each reports its longest run of refused requests. Once the old Redis is
// stopped, a daemon of the new one alone replays every acknowledged completion byte for
// byte.
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
	// Each client keeps every answer it got, to find its longest run of refused requests.
	const clients = 4
	answers := make([][]answer, clients)
	var servedAt [clients]atomic.Int64 // when each client last got a 2xx answer, in ns
	for w := range clients {
		load.Go(func() {
			call := func(daemon int, path string, body map[string]any) (int, map[string]any) {
				d := daemons[daemon]()
				a := answer{daemon: daemon, path: path, start: time.Now()}
				var out map[string]any
				a.code, out, a.problemJSON = d.callTimed(path, body)
				a.end = time.Now()
				a.problem, _ = out["code"].(string)
				answers[w] = append(answers[w], a)
				if a.code/100 == 2 {
					servedAt[w].Store(a.end.UnixNano())
				}
				return a.code, out
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				daemon := (w + i) % 2
				key := fmt.Sprintf("live-%d", (i*7+w*13)%200)
				if i%3 == 0 {
					key = fmt.Sprintf("before-%d", (i*31+w)%before)
				}
				code, out := call(daemon, "/v1/claim", map[string]any{"key": key, "lease_ms": 30000})
				if code != 201 {
					continue
				}
				base := daemons[daemon]().base
				mu.Lock()
				if by, twice := acquired[key]; twice {
					t.Errorf("%s acquired a second time (first by %s, now by %s)", key, by, base)
				}
				acquired[key] = base
				mu.Unlock()
				body := "done by " + base
				for try := 0; try < 50; try++ {
					// A daemon of the old store answers store_moved once the key moved:
					// the client goes to the other.
					c, _ := call((w+i+try)%2, "/v1/complete", map[string]any{"key": key, "lease_token": out["lease_token"],
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
	restartedAt := time.Now()
	// Not done while a daemon serves the old store alone: it may still write there.
	wait.For(t, 120*time.Second, "the copier to find nothing left but the old store's own daemon", func() bool {
		v := restarted.metric(t, "idemd_migration_alone_daemons")
		return v != "" && v != "0"
	})
	if restarted.metric(t, "idemd_migration_done") == "1" {
		t.Fatal("the copier is done while a daemon serves the old store alone")
	}
	// The refusals end: every client is served again once the daemon is back.
	wait.For(t, 120*time.Second, "every client to be served again after the restart", func() bool {
		for w := range clients {
			if servedAt[w].Load() < restartedAt.UnixNano() {
				return false
			}
		}
		return true
	})
	close(stop)
	load.Wait()
	for w := range clients {
		checkRefusals(t, w, answers[w])
	}
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

// answer is one request of a client during a live move, and what it got.
type answer struct {
	daemon      int // 0: the daemon of the old store alone, 1: the migrating one
	path        string
	start, end  time.Time
	code        int // 0: no answer (the migrating daemon was killed)
	problem     string
	problemJSON bool
}

// refused: the service did not serve the request (503, or no answer at all). A 409
// in_progress is served: another caller holds the key.
func (a answer) refused() bool { return a.code == 0 || a.code == http.StatusServiceUnavailable }

// checkRefusals checks that every answer a client got during the move is one the
// documentation names, and reports the client's longest run of consecutive refused
// requests: how many, how long from the first one's start to the last one's end, and
// what they got; and the longest time it waited between two served answers.
func checkRefusals(t *testing.T, client int, answers []answer) {
	t.Helper()
	var refused, longest, run int
	var longestFrom, longestTo, from, served time.Time
	var unserved time.Duration // the longest time between two served answers
	kinds, longestKinds := map[string]int{}, map[string]int{}
	for _, a := range answers {
		switch {
		case a.code == 200 || a.code == 201:
		case a.code == http.StatusConflict && a.problemJSON && a.problem == "in_progress" && a.path == "/v1/claim":
		case a.code == http.StatusServiceUnavailable && a.problemJSON && (a.problem == "store_moved" || a.problem == "store_unavailable"):
		case a.code == 0 && a.daemon == 1:
		default:
			t.Errorf("client %d: %s through daemon %d answered %d %q (problem+json: %v)", client, a.path, a.daemon, a.code, a.problem, a.problemJSON)
		}
		if !a.refused() {
			if !served.IsZero() {
				unserved = max(unserved, a.end.Sub(served))
			}
			served = a.end
			run = 0
			clear(kinds)
			continue
		}
		refused++
		if run == 0 {
			from = a.start
		}
		run++
		kind := "no answer"
		if a.code != 0 {
			kind = fmt.Sprintf("%d %s", a.code, a.problem)
		}
		kinds[kind]++
		if run > longest {
			longest, longestFrom, longestTo = run, from, a.end
			clear(longestKinds)
			maps.Copy(longestKinds, kinds)
		}
	}
	t.Logf("client %d: %d requests, %d refused; longest run of refused requests: %d in %v %v; longest time between two served answers: %v",
		client, len(answers), refused, longest, longestTo.Sub(longestFrom).Round(time.Millisecond), longestKinds, unserved.Round(time.Millisecond))
}

// callTimed is call without failing the test on a connection error (a killed daemon:
// code 0), and says whether the answer is problem+json.
func (p *process) callTimed(path string, body any) (int, map[string]any, bool) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(p.base+path, "application/json", strings.NewReader(string(b)))
	if err != nil {
		return 0, nil, false
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json")
}
