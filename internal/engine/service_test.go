package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/testing/wait"
)

// The wait loop of Service.Claim runs here on synctest's clock: time moves only when
// every goroutine is blocked, so each test can say at exactly which instant a waiter
// answers and what woke it, without depending on how fast the machine is. A
// time.Sleep here moves that clock to the instant the test acts at; it does not wait
// for another goroutine.

var waitKey = engine.ID{Tenant: engine.DefaultTenant, Key: "k"}

type answered struct {
	res engine.ClaimResult
	err error
	at  time.Duration
}

// startWaiter sends a claim that waits up to wait, and reports its answer with the
// time it took.
func startWaiter(ctx context.Context, svc *engine.Service, wait time.Duration) <-chan answered {
	out := make(chan answered, 1)
	start := time.Now()
	go func() {
		res, err := svc.Claim(ctx, engine.ClaimRequest{ID: waitKey, Wait: wait})
		out <- answered{res, err, time.Since(start)}
	}()
	return out
}

// hold claims the key for lease and returns the lease token.
func hold(t *testing.T, svc *engine.Service, lease time.Duration) string {
	t.Helper()
	res, err := svc.Claim(t.Context(), engine.ClaimRequest{ID: waitKey, Lease: lease})
	if err != nil || res.Outcome != engine.OutcomeAcquired {
		t.Fatalf("holder's claim: %v %v", res.Outcome, err)
	}
	return res.Record.LeaseToken
}

func TestServiceWaitIsWokenByTheCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newMemStore()
		svc := engine.NewService(store, time.Hour)
		tok := hold(t, svc, 30*time.Second)
		waiter := startWaiter(t.Context(), svc, 10*time.Second)
		// Half-way between two rechecks, so that only the notification explains an answer
		// at this instant.
		time.Sleep(2500 * time.Millisecond)
		if _, err := svc.Complete(t.Context(), engine.Completion{ID: waitKey, LeaseToken: tok, Response: engine.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
		a := <-waiter
		if a.err != nil || a.res.Outcome != engine.OutcomeCompleted {
			t.Fatalf("waiter: %v %v, want completed", a.res.Outcome, a.err)
		}
		if a.at != 2500*time.Millisecond {
			t.Fatalf("waiter answered at %s, want at the completion, 2.5s", a.at)
		}
	})
}

func TestServiceWaitRechecksWhenNotificationsAreLost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []engine.Option
		answers time.Duration
	}{
		{"at the default one-second recheck", nil, 3 * time.Second},
		{"at a recheck of five seconds", []engine.Option{engine.Recheck(5 * time.Second)}, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := newMemStore()
				store.mute = true
				svc := engine.NewService(store, time.Hour, tc.opts...)
				tok := hold(t, svc, 30*time.Second)
				waiter := startWaiter(t.Context(), svc, 10*time.Second)
				time.Sleep(2500 * time.Millisecond)
				if _, err := svc.Complete(t.Context(), engine.Completion{ID: waitKey, LeaseToken: tok, Response: engine.Response{Status: 200}}); err != nil {
					t.Fatal(err)
				}
				a := <-waiter
				if a.err != nil || a.res.Outcome != engine.OutcomeCompleted || a.at != tc.answers {
					t.Fatalf("waiter: %v %v at %s, want completed at %s", a.res.Outcome, a.err, a.at, tc.answers)
				}
			})
		})
	}
}

func TestServiceWaitTakesOverALeaseThatRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newMemStore()
		store.mute = true // a lease running out notifies nobody anyway
		svc := engine.NewService(store, time.Hour, engine.Recheck(time.Hour))
		hold(t, svc, 2500*time.Millisecond)
		a := <-startWaiter(t.Context(), svc, 10*time.Second)
		if a.err != nil || a.res.Outcome != engine.OutcomeAcquired || a.res.Record.Attempt != 2 || !a.res.Record.Recovered {
			t.Fatalf("waiter: %v attempt %d recovered %v %v, want a recovered attempt 2", a.res.Outcome, a.res.Record.Attempt, a.res.Record.Recovered, a.err)
		}
		if a.at != 2500*time.Millisecond {
			t.Fatalf("waiter acquired at %s, want when the lease ran out, 2.5s", a.at)
		}
		if store.claims != 3 {
			t.Fatalf("%d claims reached the store, want 3: the holder's, the waiter's first, and one when the lease ran out", store.claims)
		}
	})
}

func TestServiceWaitRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := engine.NewService(newMemStore(), time.Hour)
		hold(t, svc, 30*time.Second)
		a := <-startWaiter(t.Context(), svc, 3*time.Second)
		var busy *engine.InProgressError
		if !errors.As(a.err, &busy) || a.at != 3*time.Second || busy.RetryAfter != 27*time.Second {
			t.Fatalf("waiter: %v at %s, want in progress at 3s with 27s left", a.err, a.at)
		}
	})
}

func TestServiceWaitEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := engine.NewService(newMemStore(), time.Hour)
		hold(t, svc, 30*time.Second)
		ctx, cancel := context.WithCancel(t.Context())
		waiter := startWaiter(ctx, svc, 10*time.Second)
		time.Sleep(1500 * time.Millisecond)
		cancel()
		a := <-waiter
		if !errors.Is(a.err, engine.ErrInProgress) || a.at != 1500*time.Millisecond {
			t.Fatalf("waiter: %v at %s, want in progress when its context ended at 1.5s", a.err, a.at)
		}
	})
}

func TestServiceClaimWithoutWaitAsksOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newMemStore()
		svc := engine.NewService(store, time.Hour)
		hold(t, svc, 30*time.Second)
		a := <-startWaiter(t.Context(), svc, 0)
		if !errors.Is(a.err, engine.ErrInProgress) || a.at != 0 || store.claims != 2 || len(store.watches[waitKey]) != 0 {
			t.Fatalf("claim without wait: %v at %s after %d claims, want in progress at once after 2 claims, no watch", a.err, a.at, store.claims)
		}
	})
}

// TestServiceUsageDropsAcquisitionsWhenTheyExpire: what the daemon acquired since the
// last read of a tenant's usage counts only until its record would expire, without a
// read of the store to say so.
func TestServiceUsageDropsAcquisitionsWhenTheyExpire(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{SweepInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	s := engine.NewService(store, time.Hour, engine.WithUsageRefresh(time.Hour))
	if u, err := s.Usage(t.Context(), "capped"); err != nil || u.Records != 0 {
		t.Fatalf("usage before any claim: %+v, %v", u, err)
	}
	for _, key := range []string{"a", "b"} {
		_, err := s.Claim(t.Context(), engine.ClaimRequest{ID: engine.ID{Tenant: "capped", Key: key},
			Retention: 100 * time.Millisecond, Caps: engine.Caps{MaxRecords: 10}})
		if err != nil {
			t.Fatal(err)
		}
	}
	u, err := s.Usage(t.Context(), "capped")
	if err != nil || u.Records != 2 || u.NextDrop.IsZero() {
		t.Fatalf("usage after two claims: %+v, %v; want 2 records and when they drop", u, err)
	}
	wait.For(t, 30*time.Second, "the acquisitions to drop out of the usage once their records expire", func() bool {
		u, err = s.Usage(t.Context(), "capped")
		return err == nil && u.Records == 0
	})
}
