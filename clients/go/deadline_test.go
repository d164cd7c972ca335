package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// The tests below check the holder's own reckoning of its lease: the local deadline
// that ends a lease whose renewals get no answer, the renewals tried sooner as it
// nears, and leases that must not end early.

// reckoned is the part of a lease the holder counts on: 95 % of it.
func reckoned(lease time.Duration) time.Duration { return lease - lease/20 }

// holdUntil waits, in work run under a lease, until cond holds. It gives up when the
// lease ends first (with the lease's cause), or after timeout.
func holdUntil(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	timeout = testenv.Scale(timeout)
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the lease ended while waiting for %s: %w", what, context.Cause(ctx))
		case <-time.After(pause):
		}
	}
	return nil
}

// relay is a proxy in front of idemd. delay, when set, is how long it holds each
// request before passing it on (a slow link or a slow idemd); answered, when set, sees
// each answer before the caller does. claims counts the claims it passed on.
type relay struct {
	delay    func() time.Duration
	answered func(*http.Response)
	claims   atomic.Int32
}

func (rl *relay) start(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	if rl.answered != nil {
		proxy.ModifyResponse = func(resp *http.Response) error {
			rl.answered(resp)
			return nil
		}
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rl.delay != nil {
			// The slowness this relay stands for, not a wait for anything.
			time.Sleep(rl.delay())
		}
		if r.URL.Path == "/v1/claim" {
			rl.claims.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestDoLeaseExpiresWhenTheLinkIsCut: a holder's link to idemd is cut right after its
// claim. It hears nothing from idemd, yet its lease ends, by its own deadline, before
// idemd lets another caller take the key over; the caller that does stores its
// result, which the holder's late one does not replace.
func TestDoLeaseExpiresWhenTheLinkIsCut(t *testing.T) {
	holder, link := stalledHolder(t)
	key := freshKey("do-expired")
	const lease = 500 * time.Millisecond
	type end struct {
		cause     error
		deadline  time.Time
		remaining time.Duration
	}
	holding := make(chan struct{})
	ended := make(chan end, 1)
	done := make(chan error, 1)
	sent := time.Now()
	go func() {
		_, err := holder.Do(context.Background(), key, "", func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			link.cut.Store(true)
			close(holding)
			select {
			case <-ctx.Done():
			case <-time.After(testenv.Scale(30 * time.Second)):
				return idem.Response{}, errors.New("the lease went on with its link cut")
			}
			ended <- end{context.Cause(ctx), l.Deadline(), l.Remaining()}
			// The holder finishes its work anyway: its result must not be stored.
			return idem.Response{Status: 202, Body: []byte("stale")}, nil
		}, idem.DoOptions{Lease: lease})
		done <- err
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("the holder ended before it held the key: %v", err)
	}
	second, takenAt := takeOver(t, newClient(t), key)
	err := <-done
	var e end
	select {
	case e = <-ended:
	default:
		t.Fatalf("the holder's work did not see its lease end; Do returned %v", err)
	}

	if !errors.Is(e.cause, idem.ErrLeaseExpired) || !errors.Is(e.cause, idem.ErrLeaseLost) {
		t.Fatalf("the holder's context ended with %v, want a cause matching ErrLeaseExpired and ErrLeaseLost", e.cause)
	}
	if !errors.Is(err, idem.ErrLeaseExpired) || !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the holder's Do returned %v, want ErrLeaseExpired, which matches ErrLeaseLost", err)
	}
	if e.deadline.After(sent.Add(lease)) || e.remaining != 0 {
		t.Fatalf("the holder's deadline %s after its call, %s remaining; want at most the lease (%s), and 0 left",
			e.deadline.Sub(sent), e.remaining, lease)
	}
	// idemd gave the key up a lease after it received the claim, which was after the
	// holder sent it: so after the holder's deadline.
	if takenAt.Before(e.deadline) {
		t.Fatalf("the key was taken over %s before the holder's deadline", e.deadline.Sub(takenAt))
	}
	// Recovered: the holder did not release the key.
	if want := (idem.Lease{Key: key, Attempt: 2, Recovered: true}); fields(second) != want {
		t.Fatalf("the lease of the caller that took over: %+v, want %+v", second, want)
	}
	rec, err := newClient(t).Lookup(t.Context(), key)
	if err != nil || rec.State != "completed" || rec.Attempt != 2 || rec.Response == nil || rec.Response.Status != 200 {
		t.Fatalf("the record after the takeover: %+v %v, want the result of attempt 2", rec, err)
	}
	res, err := newClient(t).Do(t.Context(), key, "", func(context.Context) (idem.Response, error) {
		return idem.Response{}, errors.New("ran again after the key was done")
	})
	if err != nil || !res.Replayed || res.Status != 200 {
		t.Fatalf("a later Do: %+v %v, want the takeover's result replayed", res, err)
	}
}

// TestDoLeaseOutlivesABriefCut: the link is cut for a while shorter than the lease;
// renewals fail meanwhile and are tried again sooner, one gets through once the link
// is back, and the lease lasts past the deadline its claim gave it.
func TestDoLeaseOutlivesABriefCut(t *testing.T) {
	holder, link := stalledHolder(t)
	key := freshKey("do-blip")
	lease := testenv.Scale(2 * time.Second) // room for a loaded machine's failed renewals
	res, err := holder.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		l, _ := idem.LeaseFrom(ctx)
		first := l.Deadline()
		link.cut.Store(true)
		if err := holdUntil(ctx, 30*time.Second, "two renewals refused", func() bool { return link.refusedRenewals.Load() >= 2 }); err != nil {
			return idem.Response{}, err
		}
		link.cut.Store(false)
		if err := holdUntil(ctx, 30*time.Second, "a renewal answered", func() bool { return l.Deadline().After(first) }); err != nil {
			return idem.Response{}, err
		}
		// The work goes on past the deadline the claim alone gave.
		if err := holdUntil(ctx, 30*time.Second, "the claim's deadline", func() bool { return time.Now().After(first) }); err != nil {
			return idem.Response{}, err
		}
		if l.Remaining() <= 0 {
			return idem.Response{}, fmt.Errorf("the renewed lease has %s left", l.Remaining())
		}
		return idem.Response{Status: 201, Body: []byte("kept")}, nil
	}, idem.DoOptions{Lease: lease})
	if err != nil || res.Status != 201 {
		t.Fatalf("Do through a brief cut: %+v %v", res, err)
	}
	if n := link.answeredRenewals.Load(); n < 1 {
		t.Fatalf("%d renewals answered after the cut", n)
	}
	rec, err := newClient(t).Lookup(t.Context(), key)
	if err != nil || rec.State != "completed" || rec.Attempt != 1 || rec.Response == nil || string(rec.Response.Body) != "kept" {
		t.Fatalf("the record: %+v %v, want the holder's result", rec, err)
	}
}

// TestNoFalseExpiries: many holders, with leases of several lengths, run work for two
// and a half leases each through a relay that makes idemd slow (20 to 50 ms a
// request); their renewals are answered late but in time, many of them in batches,
// and no lease may end. A renewal has 62 % of the lease to be answered in; a batching
// client's renewal may wait for the batch in flight and then go in the next, which
// doubles its round trip, so the shortest lease here leaves room for two round trips
// of 150 ms on a busy machine, times the slowdown factor, since a slower machine takes
// longer to answer.
func TestNoFalseExpiries(t *testing.T) {
	rl := &relay{delay: func() time.Duration { return 20*time.Millisecond + rand.N(30*time.Millisecond) }}
	url := rl.start(t, daemonURL)
	const holders = 25
	var wg sync.WaitGroup
	var keys sync.Map
	for _, lease := range []time.Duration{testenv.Scale(500 * time.Millisecond), testenv.Scale(time.Second), testenv.Scale(2 * time.Second)} {
		// One client per lease, so that its holders' calls share batches.
		c, err := idem.New(url)
		if err != nil {
			t.Fatal(err)
		}
		for i := range holders {
			key := freshKey(fmt.Sprintf("healthy-%s-%d", lease, i))
			keys.Store(key, true)
			wg.Go(func() {
				_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
					select {
					case <-ctx.Done():
						return idem.Response{}, context.Cause(ctx)
					case <-time.After(5 * lease / 2):
					}
					return idem.Response{Status: 200, Body: []byte(key)}, nil
				}, idem.DoOptions{Lease: lease})
				if err != nil {
					t.Errorf("a holder with a %s lease: %v", lease, err)
				}
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	c := newClient(t)
	keys.Range(func(k, _ any) bool {
		key := k.(string)
		rec, err := c.Lookup(t.Context(), key)
		if err != nil || rec.State != "completed" || rec.Attempt != 1 || rec.Response == nil || string(rec.Response.Body) != key {
			t.Errorf("%s: %+v %v, want the holder's result", key, rec, err)
		}
		return true
	})
}

// TestRenewalRetry: a failed renewal is tried again after a delay drawn from [d/2, d],
// where d is the lease/6, or a third of the time left once that is shorter, and at
// least 10 ms; the draws spread over the range.
func TestRenewalRetry(t *testing.T) {
	for _, tc := range []struct {
		lease, left, d time.Duration
	}{
		{30 * time.Second, 20 * time.Second, 5 * time.Second},
		{30 * time.Second, 6 * time.Second, 2 * time.Second},
		{time.Second, 600 * time.Millisecond, 166666666},
		{time.Second, 90 * time.Millisecond, 30 * time.Millisecond},
		{time.Second, 0, 10 * time.Millisecond},
		{time.Second, -time.Second, 10 * time.Millisecond},
		{30 * time.Millisecond, time.Second, 10 * time.Millisecond},
	} {
		lo, hi := tc.d, time.Duration(0)
		for range 2000 {
			got := idem.RenewalRetry(tc.lease, tc.left)
			if got < tc.d/2 || got > tc.d {
				t.Fatalf("lease %s with %s left: a retry after %s, want within [%s, %s]", tc.lease, tc.left, got, tc.d/2, tc.d)
			}
			lo, hi = min(lo, got), max(hi, got)
		}
		if lo > tc.d/2+tc.d/8 || hi < tc.d-tc.d/8 {
			t.Fatalf("lease %s with %s left: 2000 draws within [%s, %s], want them spread over [%s, %s]", tc.lease, tc.left, lo, hi, tc.d/2, tc.d)
		}
	}
}

// otherHolder takes key, with fingerprint, for 20 s, so that a claim made after it
// waits. Its letGo
// gives the key back once that claim, sent at sent through rl, has waited more than a
// third of lease, so that the claim acquires late; it returns when it let go.
func otherHolder(t *testing.T, key, fingerprint string) (letGo func(rl *relay, lease time.Duration, sent time.Time) time.Time) {
	t.Helper()
	c := newClient(t)
	cl, err := c.Claim(t.Context(), key, idem.ClaimOptions{Fingerprint: fingerprint, Lease: 20 * time.Second})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("the other holder's claim: %+v %v", cl, err)
	}
	return func(rl *relay, lease time.Duration, sent time.Time) time.Time {
		t.Helper()
		testenv.WaitFor(t, 20*time.Second, "the claim to wait a third of its lease", func() bool {
			return rl.claims.Load() >= 1 && time.Since(sent) > lease/3
		})
		released := time.Now()
		if err := c.Release(t.Context(), key, cl.Token, idem.Retry, nil); err != nil {
			t.Fatal(err)
		}
		return released
	}
}

// TestDoRenewsALateClaimFirst: a claim that waited longer than a third of its lease
// for another holder is renewed before the work starts, so that the work gets a
// deadline reckoned from that renewal rather than one already near.
func TestDoRenewsALateClaimFirst(t *testing.T) {
	rl := &relay{}
	c, err := idem.New(rl.start(t, daemonURL))
	if err != nil {
		t.Fatal(err)
	}
	key := freshKey("do-waited")
	const lease = 900 * time.Millisecond
	letGo := otherHolder(t, key, "")
	deadlines := make(chan time.Time, 1)
	done := make(chan error, 1)
	sent := time.Now()
	go func() {
		_, err := c.Do(context.Background(), key, "", func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			deadlines <- l.Deadline()
			return idem.Response{Status: 200}, nil
		}, idem.DoOptions{Lease: lease, Wait: 20 * time.Second})
		done <- err
	}()
	released := letGo(rl, lease, sent)
	if err := <-done; err != nil {
		t.Fatalf("Do after a wait: %v", err)
	}
	// The claim was answered after the release; the renewal was sent after that.
	if d := <-deadlines; d.Before(released.Add(reckoned(lease))) {
		t.Fatalf("the work's deadline is %s after the other holder let go, want at least %s: reckoned from the claim, not from a renewal after it",
			d.Sub(released), reckoned(lease))
	}
}

// TestALateClaimFindsItsLeaseGone: a claim that waited is answered, and the key is
// purged before the renewal made before the work starts: the work does not run, the
// call fails with a lease lost by idemd's answer (not by expiry), and nothing is
// stored.
func TestALateClaimFindsItsLeaseGone(t *testing.T) {
	const lease = 900 * time.Millisecond
	purger := newClient(t)
	// purgeOnAcquire is a relay that purges the key as its claim is answered acquired.
	purgeOnAcquire := func(key string) *relay {
		return &relay{answered: func(resp *http.Response) {
			if resp.Request.URL.Path == "/v1/claim" && resp.StatusCode == http.StatusCreated {
				if err := purger.Purge(context.Background(), key); err != nil {
					t.Error(err)
				}
			}
		}}
	}

	t.Run("Do", func(t *testing.T) {
		key := freshKey("do-waited-lost")
		rl := purgeOnAcquire(key)
		c, err := idem.New(rl.start(t, daemonURL))
		if err != nil {
			t.Fatal(err)
		}
		letGo := otherHolder(t, key, "")
		var ran atomic.Bool
		done := make(chan error, 1)
		sent := time.Now()
		go func() {
			_, err := c.Do(context.Background(), key, "", func(ctx context.Context) (idem.Response, error) {
				ran.Store(true)
				return idem.Response{Status: 200}, nil
			}, idem.DoOptions{Lease: lease, Wait: 20 * time.Second})
			done <- err
		}()
		letGo(rl, lease, sent)
		err = <-done
		if !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrLeaseExpired) || ran.Load() {
			t.Fatalf("Do whose lease was gone before the work: %v (ran %t), want ErrLeaseLost from idemd's answer and no run", err, ran.Load())
		}
		if _, err := purger.Lookup(t.Context(), key); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("a record after the lease was lost: %v", err)
		}
	})

	t.Run("Middleware", func(t *testing.T) {
		key := freshKey("mw-waited-lost")
		rl := purgeOnAcquire(idem.MiddlewareKey("alice", key))
		c, err := idem.New(rl.start(t, daemonURL))
		if err != nil {
			t.Fatal(err)
		}
		var inc incidents
		h := &orders{}
		url := serveWith(t, c, h, idem.WithLease(lease), idem.WithWait(20*time.Second), inc.option())
		// The other holder is a request like the one sent below.
		req := httptest.NewRequest(http.MethodPost, "/orders", nil)
		req.Header.Set("Content-Type", "application/json")
		letGo := otherHolder(t, idem.MiddlewareKey("alice", key), idem.Fingerprint(req, []byte(`{}`)))
		answers := make(chan reply, 1)
		sent := time.Now()
		go func() {
			r, err := call{key: key, body: `{}`}.send(t, context.Background(), url)
			if err != nil {
				t.Error(err)
			}
			answers <- r
		}()
		letGo(rl, lease, sent)
		r := <-answers
		if r.status != 409 || r.problemCode() != "lease_lost" || r.header.Get("Retry-After") != "1" || h.runs.Load() != 0 {
			t.Fatalf("answer: %+v; the handler ran %d times; want 409 lease_lost, Retry-After 1, and no run", r, h.runs.Load())
		}
		testenv.WaitFor(t, 10*time.Second, "the lease_lost incident", func() bool { return inc.count(idem.IncidentLeaseLost) == 1 })
		if n := inc.count(idem.IncidentLeaseExpired); n != 0 {
			t.Fatalf("%d lease_expired incidents for a lease idemd said was gone", n)
		}
	})
}
