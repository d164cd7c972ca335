package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// clusterDaemons starts n daemons, each with its own connections, over one cluster.
func clusterDaemons(t *testing.T, cluster *testredis.Cluster, n int, opts redisstore.Options) []*daemon {
	t.Helper()
	ds := make([]*daemon, n)
	for i := range ds {
		store, err := redisstore.OpenWith(cluster.URL(), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		ds[i] = newDaemon(t, store)
	}
	return ds
}

// poster sends JSON over a shared client and reports the status and decoded body;
// a transport failure is status 0.
type poster struct{ client *http.Client }

func newPoster() *poster {
	return &poster{client: &http.Client{Timeout: wait.Scale(30 * time.Second), Transport: &http.Transport{MaxIdleConnsPerHost: 128}}}
}

func (p *poster) post(url, path, body string) (int, map[string]any) {
	resp, err := p.client.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// TestClusterSeveralDaemons is the shared deployment: three daemons over one Redis
// Cluster.
func TestClusterSeveralDaemons(t *testing.T) {
	t.Parallel()
	cluster := testredis.StartCluster(t)
	ds := clusterDaemons(t, cluster, 3, redisstore.Options{})

	t.Run("storm of 1000 keys by 50 claimers over three daemons", func(t *testing.T) {
		storm(t, ds, 1000, 50)
	})

	t.Run("a waiter on one daemon wakes on a completion through another", func(t *testing.T) {
		key := freshKey("cluster-wake")
		tok := ds[1].acquire(key, "lease_ms", 60000)
		waited := make(chan answer, 1)
		go func() { waited <- ds[0].claim(map[string]any{"key": key, "wait_ms": 30000}) }()
		waitForMetric(t, ds[0], "idemd_claim_waiters 1")
		if a := ds[2].complete(key, tok, 201, []byte("done")); a.status != 200 {
			t.Fatalf("complete through the third daemon: %d %s", a.status, a.raw)
		}
		// Without the notification the waiter would answer 409 when its wait ran out.
		if a := <-waited; a.status != 200 || a.str("outcome") != "completed" {
			t.Fatalf("waiter: %d %s, want woken by the completion", a.status, a.raw)
		}
	})

	t.Run("resharding under load answers nothing wrongly", func(t *testing.T) {
		testReshardUnderLoad(t, cluster, ds)
	})
}

// cycleLoad runs claim+complete cycles through the daemons from pairs of workers
// that share keys, so that claims contend, and records every answer.
type cycleLoad struct {
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu sync.Mutex
	// acquired counts the 201s per key; completed holds the keys whose completion
	// was acknowledged; wrong lists answers the contract does not allow.
	acquired    map[string]int
	completed   map[string]bool
	wrong       []string
	unavailable atomic.Int64
	// leaseLostAllowed says whether a completion may answer 409 lease_lost now: only
	// when a failover may have forgotten the claim.
	leaseLostAllowed func() bool
	// onAcquire runs, under mu, after a key's acquisition is counted.
	onAcquire func(key string, acquisitions int)
}

func startCycleLoad(ds []*daemon, workers int, l *cycleLoad) *cycleLoad {
	ctx, stop := context.WithCancel(context.Background())
	l.stop, l.acquired, l.completed = stop, map[string]int{}, map[string]bool{}
	p := newPoster()
	prefix := freshKey("load")
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil && i < 1_000_000; i++ {
				key := fmt.Sprintf("%s-%d-%d", prefix, w/2, i)
				d := ds[(w+i)%len(ds)]
				code, body := p.post(d.url, "/v1/claim", fmt.Sprintf(`{"key":%q,"owner":"w%d"}`, key, w))
				switch code {
				case 201:
					l.mu.Lock()
					l.acquired[key]++
					if l.onAcquire != nil {
						l.onAcquire(key, l.acquired[key])
					}
					l.mu.Unlock()
					tok, _ := body["lease_token"].(string)
					cc, cb := p.post(d.url, "/v1/complete", fmt.Sprintf(`{"key":%q,"lease_token":%q,"response":{"status":200}}`, key, tok))
					switch {
					case cc == 200:
						l.mu.Lock()
						l.completed[key] = true
						l.mu.Unlock()
					case cc == 503:
						l.unavailable.Add(1)
					case cc == 409 && l.leaseLostAllowed != nil && l.leaseLostAllowed():
					default:
						l.fail(fmt.Sprintf("complete %s: %d %v", key, cc, cb))
					}
				case 200, 409:
				case 503:
					l.unavailable.Add(1)
				default:
					l.fail(fmt.Sprintf("claim %s: %d %v", key, code, body))
				}
			}
		}()
	}
	return l
}

func (l *cycleLoad) fail(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wrong = append(l.wrong, what)
}

// done is the number of acknowledged completions so far.
func (l *cycleLoad) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.completed)
}

// waitDone waits until n completions are acknowledged.
func (l *cycleLoad) waitDone(t *testing.T, n int) {
	t.Helper()
	wait.For(t, 60*time.Second, fmt.Sprintf("%d acknowledged completions", n), func() bool { return l.done() >= n })
}

// finish stops the load and reports the answers the contract does not allow.
func (l *cycleLoad) finish(t *testing.T) {
	t.Helper()
	l.stop()
	l.wg.Wait()
	for _, w := range l.wrong {
		t.Error(w)
	}
}

// testReshardUnderLoad moves slots between masters with redis-cli while claims and
// completions run through the daemons. Every answer must be one the contract allows
// (a 503 is allowed; go-redis follows MOVED and ASK), and no key may be acquired twice.
func testReshardUnderLoad(t *testing.T, cluster *testredis.Cluster, ds []*daemon) {
	masters := cluster.Masters()
	from, to := nodeID(t, masters[0]), nodeID(t, masters[1])
	load := startCycleLoad(ds, 16, &cycleLoad{})
	before := load.done()
	out, err := exec.Command("redis-cli", "--cluster", "reshard", masters[0].Addr(),
		"--cluster-from", from, "--cluster-to", to, "--cluster-slots", "1500", "--cluster-yes").CombinedOutput()
	during := load.done() - before
	load.finish(t)
	if err != nil {
		t.Fatalf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
	t.Logf("%d cycles completed while 1500 slots moved", during)
	if during == 0 {
		t.Fatal("no cycle ran while the slots moved; the test proved nothing")
	}
	for key, n := range load.acquired {
		if n != 1 {
			t.Errorf("%s acquired %d times", key, n)
		}
	}
	if err := cluster.WaitHealthy(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// nodeID is a node's cluster ID.
func nodeID(t *testing.T, s *testredis.Server) string {
	t.Helper()
	out, err := exec.Command("redis-cli", "-p", fmt.Sprint(s.Port), "CLUSTER", "MYID").Output()
	if err != nil {
		t.Fatalf("CLUSTER MYID on %s: %v", s.Addr(), err)
	}
	return strings.TrimSpace(string(out))
}
