package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/payments"
	"github.com/idemd/idemd/internal/testing/wait"
)

const (
	abandonUsers   = 12
	abandonPerUser = 25
	// crashRate is the share of requests after which the API kills itself with
	// SIGKILL between recording the payment and publishing its message.
	crashRate = "0.1"
)

// TestAbandonedPaymentsAreFinished kills the API with SIGKILL between recording a
// payment and publishing its message, again and again, while callers send each payment
// once and never retry. Nobody comes back for those requests: the completer (Go, where
// the API is TypeScript) finds their keys in idemd's abandoned-keys feed, reads the
// recovery point, publishes, and completes them. In the end every recorded payment is
// charged exactly once, every accepted one is recorded, and no key is left pending.
func TestAbandonedPaymentsAreFinished(t *testing.T) {
	if testing.Short() {
		t.Skip("a crash test of the whole system; it runs without -short")
	}
	sys := startSystem(t)
	db, bin, env, addr, node, api := sys.db, sys.bin, sys.env, sys.addr, sys.node, sys.api
	apiURL := "http://" + addr
	// The API's lease is short, so that a dead request's key is abandoned soon after.
	apiEnv := append(slices.Clip(env), "PORT="+sys.port, "LEASE_MS=1000", "CRASH_BEFORE_PUBLISH="+crashRate)
	var apiStarts atomic.Int64
	apiReady := func() bool {
		resp, err := http.Get(apiURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	// The supervisor: the API is started again whenever it dies, until the test ends.
	stopSupervising := make(chan struct{})
	supervisorDone := make(chan struct{})
	var supervisorErr error
	go func() {
		defer close(supervisorDone)
		for {
			p, err := startProcess(t, apiEnv, node, api)
			if err != nil {
				supervisorErr = err
				return
			}
			apiStarts.Add(1)
			select {
			case <-p.done:
			case <-stopSupervising:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stopSupervising)
		<-supervisorDone
	})
	wait.For(t, 60*time.Second, "the API to answer", apiReady)

	supervise(t, "go-1", env, filepath.Join(bin, "charger"))
	supervise(t, "go-2", env, filepath.Join(bin, "charger"))
	supervise(t, "completer", append(slices.Clip(env), "POLL_MS=200", "LEASE_MS=3000"), filepath.Join(bin, "completer"))

	// The callers: each payment is sent once, and never again, whatever the answer.
	var sent, accepted, unanswered atomic.Int64
	var mu sync.Mutex
	var keys []string                // the idemd keys of every payment sent
	sentAs := map[string][3]string{} // each idemd key's user, Idempotency-Key and body
	acceptedKeys := map[string]bool{}
	var callers sync.WaitGroup
	for u := range abandonUsers {
		callers.Add(1)
		go func() {
			defer callers.Done()
			user := fmt.Sprint("user-", u)
			for i := range abandonPerUser {
				// An API that is starting again refuses connections: wait for it, as a
				// load balancer would send the request to a live instance.
				wait.For(t, 60*time.Second, "the API to be up", apiReady)
				key := fmt.Sprintf("once-%d-%d-%d", u, i, time.Now().UnixNano())
				idemdKey := payments.KeyPrefix + idem.MiddlewareKey(user, key)
				body := fmt.Sprintf(`{"account":"acct-%d","cents":%d}`, rand.IntN(accounts), cents)
				sent.Add(1)
				id, ok := pay(apiURL, user, key, body)
				mu.Lock()
				keys = append(keys, idemdKey)
				sentAs[idemdKey] = [3]string{user, key, body}
				if ok {
					if id != idemdKey {
						t.Errorf("%s: accepted as %s, want its idemd key %s", key, id, idemdKey)
					}
					acceptedKeys[idemdKey] = true
					accepted.Add(1)
				} else {
					unanswered.Add(1)
				}
				mu.Unlock()
			}
		}()
	}
	callers.Wait()
	if supervisorErr != nil {
		t.Fatalf("restarting the API: %v", supervisorErr)
	}

	// No key is left pending: each is finished by the API or by the completer, or
	// was never claimed (the request died before its claim reached idemd).
	client, err := idem.New(sys.idemdURL, sys.sealing)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	var finishedByCompleter []string
	byCompleter := 0
	wait.For(t, 180*time.Second, "every payment's key to be finished", func() bool {
		byCompleter, finishedByCompleter = 0, nil
		for _, k := range keys {
			rec, err := client.Lookup(t.Context(), k)
			switch {
			case errors.Is(err, idem.ErrNotFound):
				states[k] = "never claimed"
				continue
			case err != nil:
				t.Fatalf("lookup %s: %v", k, err)
			case rec.State == "pending":
				return false
			}
			states[k] = rec.State
			if rec.Attempt > 1 {
				byCompleter++
				if rec.State == "completed" {
					finishedByCompleter = append(finishedByCompleter, k)
				}
			}
		}
		return true
	})
	page, err := client.Abandoned(t.Context(), idem.AbandonedOptions{Prefix: payments.KeyPrefix})
	if err != nil || len(page.Keys) != 0 {
		t.Fatalf("the feed still lists %v (%v)", page.Keys, err)
	}

	// Every recorded payment is charged, once.
	var recorded int
	wait.For(t, 180*time.Second, "every recorded payment to be charged", func() bool {
		var charged int
		if err := db.QueryRow(t.Context(), `SELECT count(*) FROM payments`).Scan(&recorded); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(t.Context(), `SELECT count(DISTINCT key) FROM ledger`).Scan(&charged); err != nil {
			t.Fatal(err)
		}
		return charged >= recorded
	})
	rows, err := db.Query(context.Background(), `SELECT key FROM payments`)
	if err != nil {
		t.Fatal(err)
	}
	paid := map[string]bool{}
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			t.Fatal(err)
		}
		paid[key] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	charges := map[string]int{}
	rows, err = db.Query(context.Background(), `SELECT key, count(*) FROM ledger GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		charges[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var ledger int
	for key := range paid {
		n := charges[idem.StepKey(key, payments.Step)]
		ledger += n
		if n != 1 {
			t.Errorf("payment %s charged %d times", key, n)
		}
		if states[key] != "completed" {
			t.Errorf("payment %s is recorded, and its key is %s", key, states[key])
		}
	}
	if total := sumValues(charges); total != len(paid) {
		t.Errorf("%d charges for %d recorded payments", total, len(paid))
	}
	for key := range acceptedKeys {
		if !paid[key] {
			t.Errorf("payment %s was accepted and is not recorded", key)
		}
	}
	// idemd holds every stored answer sealed. A caller who does come back gets from the
	// API (TypeScript) the answer the completer (Go) sealed: the request's own 202.
	for _, k := range keys {
		if resp := rawResponse(t, sys.idemdURL, k); resp != nil && (resp["sealed"] == nil || resp["body"] != nil) {
			t.Errorf("idemd holds the answer of %s as %v, not sealed", k, resp)
		}
	}
	for _, k := range finishedByCompleter {
		as := sentAs[k]
		wait.For(t, 60*time.Second, "the API to be up", apiReady)
		if id, ok := pay(apiURL, as[0], as[1], as[2]); !ok || id != k {
			t.Errorf("%s, sent again after the completer finished it: %q %v, want its stored 202", k, id, ok)
		}
	}

	kills := apiStarts.Load() - 1
	if kills == 0 || byCompleter == 0 {
		t.Errorf("%d API kills and %d keys finished by the completer: the test did not test the completer", kills, byCompleter)
	}
	failed := 0
	for _, st := range states {
		if st == "failed" {
			failed++
		}
	}
	msg := fmt.Sprintf("abandoned payments: %d sent once, %d accepted, %d unanswered; %d API kills; %d recorded, "+
		"%d charges; %d keys finished by the completer, of which %d never recorded (stored as failed)", sent.Load(),
		accepted.Load(), unanswered.Load(), kills, len(paid), ledger, byCompleter, failed)
	t.Log(msg)
	fmt.Println(msg)
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// rawResponse is the stored answer of key as idemd keeps it, read over plain HTTP
// without a client that would open it; nil when there is none.
func rawResponse(t *testing.T, idemdURL, key string) map[string]any {
	t.Helper()
	resp, err := http.Get(idemdURL + "/v1/records/" + url.PathEscape(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	var rec struct {
		Response map[string]any `json:"response"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("lookup %s: %d %v", key, resp.StatusCode, err)
	}
	return rec.Response
}
