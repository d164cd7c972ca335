package effects_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/effects"
	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/testpg"
	"github.com/idemd/idemd/internal/testing/wait"
)

// The tests below prove on a real PostgreSQL and a real idemd what docs/effects.md
// says: a holder whose lease ran out while it stalled, and was taken over, charges a
// second time unless its write is fenced by the lease's attempt.

const (
	account = "acct-1"
	opening = 10_000
	cents   = 500
)

var (
	buildOnce sync.Once
	idemdBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if idemdBin != "" {
		os.RemoveAll(filepath.Dir(idemdBin))
	}
	os.Exit(code)
}

// daemon runs idemd, built once per test process from this repository.
func daemon(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemd-effects-test-")
		if err != nil {
			buildErr = err
			return
		}
		idemdBin = filepath.Join(dir, "idemd")
		if out, err := exec.Command("go", "build", "-o", idemdBin, "../../cmd/idemd").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return testdaemon.Start(t, idemdBin, "/readyz", "--log-level", "warn")
}

// database is a fresh PostgreSQL with the service's tables and one account.
func database(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pg := testpg.New(t)
	db, err := pgxpool.New(t.Context(), pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Exec(t.Context(), effects.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(t.Context(), `INSERT INTO accounts VALUES ($1, $2)`, account, opening); err != nil {
		t.Fatal(err)
	}
	return db
}

// cutTransport reaches idemd until the test cuts it: a holder whose renewals stop
// arriving, as in a long pause or a partition, while its own work goes on.
type cutTransport struct{ cut atomic.Bool }

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("link to idemd cut by the test")
	}
	return http.DefaultTransport.RoundTrip(r)
}

func client(t *testing.T, url string, opts ...idem.Option) *idem.Client {
	t.Helper()
	c, err := idem.New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type charge func(ctx context.Context, db effects.DB, lease idem.Lease, account string, cents int64) (bool, error)

// stalledHolder takes key and, under its lease, runs before, cuts its link to idemd
// and waits for resume; then it runs after. Its lease runs out meanwhile. It returns
// once the holder holds the key; done gives what Do returned.
func stalledHolder(t *testing.T, url, key string, before, after func(context.Context, idem.Lease) error) (resume func(heal bool), done <-chan error) {
	t.Helper()
	link := &cutTransport{}
	c := client(t, url, idem.WithHTTPClient(&http.Client{Transport: link}), idem.WithRetries(0))
	holding := make(chan struct{})
	wake := make(chan bool)
	result := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), key, "", func(ctx context.Context) (idem.Response, error) {
			lease, _ := idem.LeaseFrom(ctx)
			if err := before(ctx, lease); err != nil {
				return idem.Response{}, err
			}
			link.cut.Store(true)
			close(holding)
			if heal := <-wake; heal {
				link.cut.Store(false)
			}
			// A holder back from a pause does not look at its context first: that is
			// the case the fence is for.
			if err := after(context.WithoutCancel(ctx), lease); err != nil {
				return idem.Response{}, err
			}
			return idem.Response{Status: 201}, nil
		}, idem.DoOptions{Lease: 300 * time.Millisecond})
		result <- err
	}()
	select {
	case <-holding:
	case err := <-result:
		t.Fatalf("the first holder ended before it stalled: %v", err)
	}
	return func(heal bool) { wake <- heal }, result
}

// takeOver runs work under key as soon as the stalled holder's lease has run out, and
// returns the lease it ran under.
func takeOver(t *testing.T, url, key string, work func(context.Context, idem.Lease) (idem.Response, error)) idem.Lease {
	t.Helper()
	c := client(t, url)
	deadline := time.Now().Add(wait.Scale(30 * time.Second))
	for {
		var lease idem.Lease
		_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
			lease, _ = idem.LeaseFrom(ctx)
			return work(ctx, lease)
		}, idem.DoOptions{Wait: time.Second})
		switch {
		case err == nil:
			return lease
		case !errors.Is(err, idem.ErrInProgress):
			t.Fatalf("taking %q over: %v", key, err)
		case time.Now().After(deadline):
			t.Fatalf("%q was never taken over: %v", key, err)
		}
	}
}

// fields is a lease's key, attempt and recovered, which the tests compare: a Lease
// also shares its deadline's reckoning with its copies, which == would compare.
func fields(l idem.Lease) idem.Lease {
	return idem.Lease{Key: l.Key, Attempt: l.Attempt, Recovered: l.Recovered}
}

type ledgerRow struct{ attempt, cents int64 }

// charges returns the ledger's rows for key and the account's balance.
func charges(t *testing.T, db *pgxpool.Pool, key string) ([]ledgerRow, int64) {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT attempt, cents FROM ledger WHERE key = $1 ORDER BY id`, key)
	if err != nil {
		t.Fatal(err)
	}
	var got []ledgerRow
	for rows.Next() {
		var r ledgerRow
		if err := rows.Scan(&r.attempt, &r.cents); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var balance int64
	if err := db.QueryRow(t.Context(), `SELECT balance_cents FROM accounts WHERE id = $1`, account).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	return got, balance
}

func nothing(context.Context, idem.Lease) error { return nil }

// TestStalledHolderAfterTakeover: the first holder stalls before charging, its lease
// runs out, a second caller takes the key over (attempt 2, recovered) and charges; then
// the first wakes up and charges. With the fence the account is charged once; without
// it, twice.
func TestStalledHolderAfterTakeover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		charge   charge
		attempts []int64
	}{
		{"fenced: the stalled holder is refused", effects.Charge, []int64{2}},
		{"unfenced: the stalled holder charges again", effects.ChargeUnfenced, []int64{2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, db := daemon(t), database(t)
			key := "charge-" + t.Name()
			resume, done := stalledHolder(t, url, key, nothing, func(ctx context.Context, lease idem.Lease) error {
				_, err := tc.charge(ctx, db, lease, account, cents)
				return err
			})
			second := takeOver(t, url, key, func(ctx context.Context, lease idem.Lease) (idem.Response, error) {
				charged, err := tc.charge(ctx, db, lease, account, cents)
				if err == nil && !charged {
					err = errors.New("the caller that took over found a charge the stalled holder never made")
				}
				return idem.Response{Status: 201}, err
			})
			if want := (idem.Lease{Key: key, Attempt: 2, Recovered: true}); fields(second) != want {
				t.Fatalf("the lease of the caller that took over: %+v, want %+v", second, want)
			}
			resume(false)
			err := <-done

			rows, balance := charges(t, db, key)
			var attempts []int64
			for _, r := range rows {
				attempts = append(attempts, r.attempt)
			}
			if fmt.Sprint(attempts) != fmt.Sprint(tc.attempts) || balance != opening-cents*int64(len(tc.attempts)) {
				t.Fatalf("charges by attempt %v and balance %d, want %v and %d", attempts, balance, tc.attempts, opening-cents*int64(len(tc.attempts)))
			}
			t.Logf("charges: %d; the stalled holder's Do: %v", len(rows), err)
			if len(tc.attempts) == 1 && !errors.Is(err, effects.ErrFenced) {
				t.Fatalf("the stalled holder's Do: %v, want ErrFenced", err)
			}
		})
	}
}

// TestRecoveredHolderReconciles: the first holder charges and stalls before storing its
// result; the caller that takes the key over is told it recovered the lease, finds the
// charge, and does not charge again.
func TestRecoveredHolderReconciles(t *testing.T) {
	url, db := daemon(t), database(t)
	key := "charge-reconcile"
	resume, done := stalledHolder(t, url, key, func(ctx context.Context, lease idem.Lease) error {
		_, err := effects.Charge(ctx, db, lease, account, cents)
		return err
	}, nothing)
	var res idem.Response
	second := takeOver(t, url, key, func(ctx context.Context, lease idem.Lease) (idem.Response, error) {
		r, err := effects.ChargeWithLease(ctx, db, lease, account, cents)
		res = r
		return r, err
	})
	if want := (idem.Lease{Key: key, Attempt: 2, Recovered: true}); fields(second) != want {
		t.Fatalf("the lease of the caller that took over: %+v, want %+v", second, want)
	}
	if res.Status != 200 {
		t.Fatalf("the recovering holder answered %d %q, want 200: the charge was already made", res.Status, res.Body)
	}
	resume(true)
	if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the stalled holder's Do: %v, want ErrLeaseLost", err)
	}
	rows, balance := charges(t, db, key)
	if len(rows) != 1 || rows[0].attempt != 1 || balance != opening-cents {
		t.Fatalf("charges %v and balance %d, want one charge by attempt 1", rows, balance)
	}
}

// TestChargeOnce: the whole pattern, called again and again for one key, charges once
// and replays the first answer.
func TestChargeOnce(t *testing.T) {
	url, db := daemon(t), database(t)
	c := client(t, url)
	for i := range 3 {
		res, err := effects.ChargeOnce(t.Context(), c, db, "charge-once", account, cents)
		if err != nil || res.Status != 201 || res.Replayed != (i > 0) {
			t.Fatalf("call %d: %+v %v", i, res, err)
		}
	}
	if rows, balance := charges(t, db, "charge-once"); len(rows) != 1 || balance != opening-cents {
		t.Fatalf("charges %v and balance %d, want one charge", rows, balance)
	}
}

// TestStaleChargeBetweenLookupAndCharge: the caller that recovered the key looks the
// charge up and finds none; the stalled holder then wakes and charges; then the
// recovering caller charges. A lookup made outside the charge's transaction would let
// both charge; the charge must find the stale holder's charge in its own transaction.
func TestStaleChargeBetweenLookupAndCharge(t *testing.T) {
	url, db := daemon(t), database(t)
	key := "charge-race"
	resume, done := stalledHolder(t, url, key, nothing, func(ctx context.Context, lease idem.Lease) error {
		_, err := effects.Charge(ctx, db, lease, account, cents)
		return err
	})
	var staleErr error
	var charged bool
	second := takeOver(t, url, key, func(ctx context.Context, lease idem.Lease) (idem.Response, error) {
		var found bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ledger WHERE key = $1)`, lease.Key).Scan(&found); err != nil || found {
			return idem.Response{}, fmt.Errorf("the look-up before the stalled holder woke: %v %v", found, err)
		}
		resume(false)
		staleErr = <-done
		var err error
		charged, err = effects.Charge(ctx, db, lease, account, cents)
		return idem.Response{Status: 201}, err
	})
	if charged {
		t.Error("the caller that took over charged after the stalled holder had")
	}
	if want := (idem.Lease{Key: key, Attempt: 2, Recovered: true}); fields(second) != want {
		t.Fatalf("the lease of the caller that took over: %+v, want %+v", second, want)
	}
	// The stalled holder charged, then could not store its result (its link is cut).
	if errors.Is(staleErr, effects.ErrFenced) {
		t.Fatalf("the stalled holder, first to charge, was fenced: %v", staleErr)
	}
	rows, balance := charges(t, db, key)
	if len(rows) != 1 || rows[0].attempt != 1 || balance != opening-cents {
		t.Fatalf("charges %v and balance %d, want one charge, by attempt 1", rows, balance)
	}
}
