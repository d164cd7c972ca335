package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/payments"
	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/testpg"
	"github.com/idemd/idemd/internal/testing/testrabbit"
	"github.com/idemd/idemd/internal/testing/wait"
)

const (
	payingUsers = 16
	perUser     = 20
	accounts    = 8
	cents       = 100
	opening     = 1_000_000_000
	maxKills    = 30
)

// required turns a missing part into a failure where CI asks for every part, and
// into a skip elsewhere.
func required(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("IDEMD_REQUIRE_RABBITMQ") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// TestEveryAcceptedPaymentIsChargedOnce runs the whole system: callers that send every
// payment more than once, the API, RabbitMQ, two Go and two Python chargers killed with
// SIGKILL at random mid-message and restarted, and PostgreSQL. Every payment the API
// accepted must be charged exactly once, and none lost.
func TestEveryAcceptedPaymentIsChargedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("a crash test of the whole system; it runs without -short")
	}
	sys := startSystem(t)
	root, db, bin := sys.root, sys.db, sys.bin
	python := filepath.Join(root, "clients/python/.venv/bin/python")
	if _, err := os.Stat(python); err != nil {
		required(t, "the Python client's venv is missing (make clients/python/.venv/installed): %v", err)
	}
	env := append(slices.Clip(sys.env), "LEASE_MS=1500", "PAUSE_MS=20")
	addr, port, node, api := sys.addr, sys.port, sys.node, sys.api
	apiProc, err := startProcess(t, append(slices.Clip(env), "PORT="+port), node, api)
	if err != nil {
		t.Fatal(err)
	}
	apiURL := "http://" + addr
	wait.For(t, 60*time.Second, "the API to answer", func() bool {
		if apiProc.exited() {
			t.Fatalf("the API exited:\n%s", apiProc.logs.String())
		}
		resp, err := http.Get(apiURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	chargers := []*supervised{
		supervise(t, "go-1", env, filepath.Join(bin, "charger")),
		supervise(t, "go-2", env, filepath.Join(bin, "charger")),
		supervise(t, "py-1", env, python, filepath.Join(root, "examples/payments/charger.py")),
		supervise(t, "py-2", env, python, filepath.Join(root, "examples/payments/charger.py")),
	}

	// The killer: a random charger is sent SIGKILL every 50–300 ms and started again,
	// until the payments are all charged or it has killed maxKills times.
	var kills atomic.Int64
	var killErr error
	stopKilling := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for kills.Load() < maxKills {
			select {
			case <-stopKilling:
				return
			case <-time.After(time.Duration(50+rand.IntN(250)) * time.Millisecond):
			}
			if killErr = chargers[rand.IntN(len(chargers))].kill(); killErr != nil {
				return
			}
			kills.Add(1)
		}
	}()

	// The callers: each payment is sent until it is accepted, and then once more (a
	// retry after a lost answer), sometimes twice at once.
	var requests, retries atomic.Int64
	var mu sync.Mutex
	accepted := map[string]bool{}
	var callers sync.WaitGroup
	for u := range payingUsers {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for i := range perUser {
				key := fmt.Sprintf("pay-%d-%d-%d", u, i, time.Now().UnixNano())
				body := fmt.Sprintf(`{"account":"acct-%d","cents":%d}`, rand.IntN(accounts), cents)
				var payment string
				sends := 2 + rand.IntN(2)
				deadline := time.Now().Add(wait.Scale(60 * time.Second))
				for n := 0; n < sends && time.Now().Before(deadline); n++ {
					requests.Add(1)
					if n > 0 {
						retries.Add(1)
					}
					id, ok := pay(apiURL, fmt.Sprint("user-", u), key, body)
					if !ok {
						n-- // not accepted (in progress, or failed for now): send again
						time.Sleep(20 * time.Millisecond)
						continue
					}
					if payment != "" && payment != id {
						t.Errorf("%s: accepted as %s, then as %s", key, payment, id)
					}
					payment = id
				}
				if payment != "" {
					mu.Lock()
					accepted[payment] = true
					mu.Unlock()
				}
			}
		}()
	}
	callers.Wait()

	// Every accepted payment is charged: wait for the ledger to hold them all.
	wait.For(t, 180*time.Second, "every accepted payment to be charged", func() bool {
		var n int
		if err := db.QueryRow(t.Context(), `SELECT count(DISTINCT key) FROM ledger`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n >= len(accepted)
	})
	close(stopKilling)
	<-killerDone
	if killErr != nil {
		t.Fatalf("restarting a killed charger: %v", killErr)
	}

	var recorded, ledger, redeliveries int
	scan := func(q string, into *int) {
		t.Helper()
		if err := db.QueryRow(context.Background(), q).Scan(into); err != nil {
			t.Fatal(err)
		}
	}
	scan(`SELECT count(*) FROM payments`, &recorded)
	scan(`SELECT count(*) FROM ledger`, &ledger)
	scan(`SELECT count(*) FROM deliveries WHERE redelivered`, &redeliveries)
	rows, err := db.Query(t.Context(), `SELECT key, count(*) FROM ledger GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	charged := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		charged[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for payment := range accepted {
		if n := charged[idem.StepKey(payment, payments.Step)]; n != 1 {
			t.Errorf("payment %s charged %d times", payment, n)
		}
	}
	if ledger != len(accepted) {
		t.Errorf("%d charges for %d accepted payments", ledger, len(accepted))
	}
	if want := payingUsers * perUser; len(accepted) != want || recorded != want {
		t.Errorf("%d payments accepted and %d recorded of %d sent", len(accepted), recorded, want)
	}
	if kills.Load() == 0 {
		t.Error("no charger was killed")
	}
	msg := fmt.Sprintf("payments: %d requests (%d retries) for %d payments; %d accepted, %d charges; "+
		"%d redeliveries, %d chargers killed",
		requests.Load(), retries.Load(), payingUsers*perUser, len(accepted), ledger, redeliveries, kills.Load())
	t.Log(msg)
	fmt.Println(msg)
}

// system is what both tests of the whole system start the same way: RabbitMQ,
// PostgreSQL with the schema and the accounts, idemd, and the binaries they run (idemd,
// the Go charger and the completer) built from this repository; env is what every
// process of the system is given, and addr where the API is to listen.
type system struct {
	root, bin, node, api string
	idemdURL             string
	db                   *pgxpool.Pool
	env                  []string
	addr, port           string
	// sealing is the key ring every program of the system seals with, as a client option.
	sealing idem.Option
}

// sealKeys is the system's key ring: a sealing key and an older one, as in a rotation.
const sealKeys = "pay-2026-11=bmV3LXBheW1lbnRzLWtleS0yMDI2LTExLTMyLWJ5dGU=,pay-2026-05=b2xkLXBheW1lbnRzLWtleS0yMDI2LTA1LTMyLWJ5dGU="

// startSystem starts the system, saying so and skipping (or failing, where CI asks for
// every part) when the API is not built or node is missing.
func startSystem(t *testing.T) *system {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	sys := &system{root: root, api: filepath.Join(root, "examples/payments/api/dist/server.js")}
	if _, err := os.Stat(sys.api); err != nil {
		required(t, "the API is not built (make payments-api): %v", err)
	}
	if sys.node, err = exec.LookPath("node"); err != nil {
		required(t, "node is not installed: %v", err)
	}

	broker := testrabbit.New(t)
	pg := testpg.New(t)
	if sys.db, err = pgxpool.New(t.Context(), pg.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.db.Close)
	if _, err := sys.db.Exec(t.Context(), payments.Schema); err != nil {
		t.Fatal(err)
	}
	for i := range accounts {
		if _, err := sys.db.Exec(t.Context(), `INSERT INTO accounts VALUES ($1, $2)`, fmt.Sprint("acct-", i), opening); err != nil {
			t.Fatal(err)
		}
	}
	sys.bin = t.TempDir()
	for name, pkg := range map[string]string{"idemd": "./cmd/idemd", "charger": "./examples/payments/charger",
		"completer": "./examples/payments/completer"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(sys.bin, name), pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	sys.idemdURL = testdaemon.Start(t, filepath.Join(sys.bin, "idemd"), "/readyz", "--log-level", "warn")
	// Every program seals what it stores (docs/sealing.md), so that a result sealed in
	// one language is opened in another.
	sys.env = append(testdaemon.Env(), "IDEMD_URL="+sys.idemdURL, "DATABASE_URL="+pg.URL, "AMQP_URL="+broker.URL,
		"IDEMD_SEAL_KEYS="+sealKeys, "IDEMD_SEAL_TENANT=payments")
	ring, err := idem.ParseKeyRing(sealKeys)
	if err != nil {
		t.Fatal(err)
	}
	sys.sealing = idem.WithSealing("payments", ring)
	sys.addr = testdaemon.FreeAddr(t)
	if _, sys.port, err = net.SplitHostPort(sys.addr); err != nil {
		t.Fatal(err)
	}
	return sys
}

// pay sends one POST /payments and returns the payment's ID when the API accepted it.
func pay(apiURL, user, key, body string) (string, bool) {
	req, err := http.NewRequest(http.MethodPost, apiURL+"/payments", bytes.NewBufferString(body))
	if err != nil {
		return "", false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return "", false
	}
	var answer struct{ Payment string }
	if json.NewDecoder(resp.Body).Decode(&answer) != nil || answer.Payment == "" {
		return "", false
	}
	return answer.Payment, true
}

// process is a child process and its output.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	logs *testdaemon.Logs
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startProcess starts a program with env, stopped (SIGKILL, by its PID) when the test
// ends. It only reports an error, so that the killer's goroutine may call it.
func startProcess(t *testing.T, env []string, path string, args ...string) (*process, error) {
	p := &process{cmd: exec.Command(path, args...), done: make(chan struct{}), logs: &testdaemon.Logs{}}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	})
	return p, nil
}

// supervised is a charger that the killer starts again each time it kills it.
type supervised struct {
	mu    sync.Mutex
	start func() (*process, error)
	proc  *process
}

func supervise(t *testing.T, name string, env []string, path string, args ...string) *supervised {
	t.Helper()
	env = append(slices.Clip(env), "CHARGER="+name)
	s := &supervised{start: func() (*process, error) { return startProcess(t, env, path, args...) }}
	var err error
	if s.proc, err = s.start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// kill sends the charger SIGKILL, waits for it to die and starts it again.
func (s *supervised) kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-s.proc.done
	var err error
	s.proc, err = s.start()
	return err
}
