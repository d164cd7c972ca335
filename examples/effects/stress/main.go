// Command stress charges keys exactly once under lease takeovers: worker processes all
// charge the same keys through idemd (effects.ChargeOnce) into one PostgreSQL, while
// the workers are paused at random (SIGSTOP) for longer than a lease, so that their
// leases run out mid-work and are taken over. At the end every key must be charged
// exactly once. It starts its own PostgreSQL and, unless -idemd names one, its own idemd.
//
//	go run ./examples/effects/stress -workers 4 -keys 2500
//
// -charge unfenced runs the same load with the fence left out, to show what it saves.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/effects"
	"github.com/idemd/idemd/internal/testing/testpg"
)

const (
	account = "acct-1"
	cents   = 100
	opening = int64(1) << 40
)

type settings struct {
	workers, keys, concurrency int
	lease, pause, every, work  time.Duration
	charge, idemdURL           string
	timeout                    time.Duration
	// The worker's own.
	worker           bool
	pgURL, keyPrefix string
}

// counts is what a worker reports, and the sums the coordinator prints.
type counts struct {
	Calls      int64 `json:"calls"`
	Ran        int64 `json:"ran"`
	Replayed   int64 `json:"replayed"`
	Recovered  int64 `json:"recovered"`
	Reconciled int64 `json:"reconciled"`
	Fenced     int64 `json:"fenced"`
	LeaseLost  int64 `json:"lease_lost"`
	InProgress int64 `json:"in_progress"`
	Other      int64 `json:"other"`
}

func main() {
	var s settings
	flag.IntVar(&s.workers, "workers", 4, "worker processes")
	flag.IntVar(&s.keys, "keys", 2500, "keys to charge; every worker charges every key, so calls = workers × keys at least")
	flag.IntVar(&s.concurrency, "concurrency", 16, "keys a worker charges at once")
	flag.DurationVar(&s.lease, "lease", 200*time.Millisecond, "the lease of every charge (idemd's minimum is 100ms)")
	flag.DurationVar(&s.pause, "pause", 400*time.Millisecond, "how long a paused worker stays paused (make it longer than -lease)")
	flag.DurationVar(&s.every, "every", 250*time.Millisecond, "how often a random worker is paused")
	flag.DurationVar(&s.work, "work", 5*time.Millisecond, "each charge first works for a random time up to this long, as a call to a slow service would")
	flag.StringVar(&s.charge, "charge", "fenced", "fenced, or unfenced to leave the fence out")
	flag.StringVar(&s.idemdURL, "idemd", "", "idemd's base URL; empty: build and run one from this repository")
	flag.DurationVar(&s.timeout, "timeout", 10*time.Minute, "give up after this long")
	flag.BoolVar(&s.worker, "worker", false, "run as a worker (the coordinator starts them)")
	flag.StringVar(&s.pgURL, "pg", "", "the worker's PostgreSQL URL")
	flag.StringVar(&s.keyPrefix, "key-prefix", "", "the worker's key prefix")
	flag.Parse()
	var err error
	if s.worker {
		err = work(s)
	} else {
		err = coordinate(s)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stress:", err)
		os.Exit(1)
	}
}

// coordinate starts PostgreSQL, idemd and the workers, pauses workers at random while
// they run, and checks the ledger.
func coordinate(s settings) error {
	if s.charge != "fenced" && s.charge != "unfenced" {
		return fmt.Errorf("-charge %q: fenced or unfenced", s.charge)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	pg, err := testpg.Start()
	if err != nil {
		return err
	}
	defer pg.Stop()
	db, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(ctx, effects.Schema); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO accounts VALUES ($1, $2)`, account, opening); err != nil {
		return err
	}
	if s.idemdURL == "" {
		url, stop, err := startIdemd()
		if err != nil {
			return err
		}
		defer stop()
		s.idemdURL = url
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	prefix := fmt.Sprintf("stress-%d-", time.Now().UnixNano())
	started := time.Now()
	workers := make([]*exec.Cmd, s.workers)
	outs := make([]*bytes.Buffer, s.workers)
	exited := make([]chan struct{}, s.workers)
	for i := range workers {
		outs[i] = &bytes.Buffer{}
		cmd := exec.Command(self, "-worker", "-pg", pg.URL, "-idemd", s.idemdURL, "-key-prefix", prefix,
			"-keys", strconv.Itoa(s.keys), "-concurrency", strconv.Itoa(s.concurrency),
			"-lease", s.lease.String(), "-work", s.work.String(), "-charge", s.charge)
		cmd.Stdout, cmd.Stderr = outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		workers[i], exited[i] = cmd, make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited[i]) }()
	}
	// Pause a random running worker every -every, for -pause, until all have exited.
	var pauses int
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	running := func() []int {
		var r []int
		for i, ch := range exited {
			select {
			case <-ch:
			default:
				r = append(r, i)
			}
		}
		return r
	}
	for r := running(); len(r) > 0; r = running() {
		select {
		case <-ctx.Done():
			for _, i := range r {
				_ = workers[i].Process.Kill()
			}
			return fmt.Errorf("the workers did not finish within %s", s.timeout)
		case <-tick.C:
		}
		if len(r) < 2 {
			continue // a lone worker has nobody to take its keys over
		}
		w := workers[r[rand.IntN(len(r))]]
		if w.Process.Signal(syscall.SIGSTOP) == nil {
			pauses++
			time.Sleep(s.pause) // the fault injected: the worker stays stopped this long
			_ = w.Process.Signal(syscall.SIGCONT)
		}
	}
	elapsed := time.Since(started)

	var sum counts
	for i, w := range workers {
		if !w.ProcessState.Success() {
			return fmt.Errorf("worker %d: %s", i, w.ProcessState)
		}
		var c counts
		// A worker's standard output is its one line of counts, read once it has exited.
		if err := json.Unmarshal(outs[i].Bytes(), &c); err != nil {
			return fmt.Errorf("worker %d reported %q: %w", i, outs[i].Bytes(), err)
		}
		sum.add(c)
	}
	var rows, keys, balance int64
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT key) FROM ledger`).Scan(&rows, &keys); err != nil {
		return err
	}
	if err := db.QueryRow(ctx, `SELECT balance_cents FROM accounts WHERE id = $1`, account).Scan(&balance); err != nil {
		return err
	}
	fmt.Printf("workers %d, keys %d, lease %s, charge %s, %s\n", s.workers, s.keys, s.lease, s.charge, elapsed.Round(time.Millisecond))
	fmt.Printf("calls %d (ran %d, replayed %d, in progress %d, lease lost %d, fenced %d, other errors %d)\n",
		sum.Calls, sum.Ran, sum.Replayed, sum.InProgress, sum.LeaseLost, sum.Fenced, sum.Other)
	fmt.Printf("pauses %d, takeovers %d (of which found charged and reconciled %d)\n", pauses, sum.Recovered, sum.Reconciled)
	fmt.Printf("charges %d for %d keys (debited %d cents)\n", rows, keys, opening-balance)
	switch {
	case keys != int64(s.keys):
		return fmt.Errorf("%d of %d keys were charged", keys, s.keys)
	case rows != keys || opening-balance != rows*cents:
		return fmt.Errorf("%d charges for %d keys: some key was charged more than once", rows, keys)
	case sum.Recovered == 0:
		return errors.New("no lease was taken over: pause longer or more often to test the fence")
	}
	fmt.Println("every key charged exactly once")
	return nil
}

func (c *counts) add(o counts) {
	c.Calls += o.Calls
	c.Ran += o.Ran
	c.Replayed += o.Replayed
	c.Recovered += o.Recovered
	c.Reconciled += o.Reconciled
	c.Fenced += o.Fenced
	c.LeaseLost += o.LeaseLost
	c.InProgress += o.InProgress
	c.Other += o.Other
}

// work charges every key, in an order of its own, until idemd has a result for each,
// and prints its counts as one JSON line.
func work(s settings) error {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, s.pgURL)
	if err != nil {
		return err
	}
	defer db.Close()
	client, err := idem.New(s.idemdURL)
	if err != nil {
		return err
	}
	charge := effects.Charge
	if s.charge == "unfenced" {
		charge = effects.ChargeUnfenced
	}
	order := rand.Perm(s.keys)
	var next atomic.Int64
	var c struct {
		calls, ran, replayed, recovered, reconciled, fenced, lost, inProgress, other atomic.Int64
	}
	var wg sync.WaitGroup
	deadline := time.Now().Add(s.timeout)
	for range s.concurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(order)) {
					return
				}
				key := fmt.Sprintf("%s%d", s.keyPrefix, order[i])
				for time.Now().Before(deadline) {
					c.calls.Add(1)
					res, err := client.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
						lease, _ := idem.LeaseFrom(ctx)
						if lease.Recovered {
							c.recovered.Add(1)
						}
						if s.work > 0 {
							time.Sleep(rand.N(s.work)) // the work before the charge, which a pause may cut
						}
						// The work does not stop for a lost lease, as a paused process
						// does not: the fence must stop it.
						charged, err := charge(context.WithoutCancel(ctx), db, lease, account, cents)
						if err == nil && !charged {
							c.reconciled.Add(1)
						}
						return idem.Response{Status: 201}, err
					}, idem.DoOptions{Lease: s.lease, Wait: 2 * time.Second})
					switch {
					case err == nil && res.Replayed:
						c.replayed.Add(1)
					case err == nil:
						c.ran.Add(1)
					case errors.Is(err, effects.ErrFenced):
						c.fenced.Add(1)
						continue
					case errors.Is(err, idem.ErrLeaseLost):
						c.lost.Add(1)
						continue
					case errors.Is(err, idem.ErrInProgress):
						c.inProgress.Add(1)
						continue
					default:
						c.other.Add(1)
						continue
					}
					break
				}
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(counts{
		Calls: c.calls.Load(), Ran: c.ran.Load(), Replayed: c.replayed.Load(), Recovered: c.recovered.Load(),
		Reconciled: c.reconciled.Load(), Fenced: c.fenced.Load(), LeaseLost: c.lost.Load(),
		InProgress: c.inProgress.Load(), Other: c.other.Load(),
	})
}

// startIdemd builds idemd from this repository and runs it on a free loopback port
// with the embedded store in a temporary directory.
func startIdemd() (url string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "idemd-stress-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "idemd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/idemd/idemd/cmd/idemd").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--listen", addr, "--data-dir", filepath.Join(dir, "data"), "--log-level", "error")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	url = "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("idemd did not get ready within 30 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
