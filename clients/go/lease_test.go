package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// cutTransport sends requests to idemd until it is cut; from then on every request
// fails as if the network were gone, so a holder's renewals stop reaching idemd while
// the holder goes on. It counts the renewals it refused and those idemd answered.
type cutTransport struct {
	cut              atomic.Bool
	refusedRenewals  atomic.Int32
	answeredRenewals atomic.Int32
}

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	renewal := r.URL.Path == "/v1/extend"
	if c.cut.Load() {
		if renewal {
			c.refusedRenewals.Add(1)
		}
		return nil, errors.New("link to idemd cut by the test")
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if renewal && err == nil && resp.StatusCode == http.StatusOK {
		c.answeredRenewals.Add(1)
	}
	return resp, err
}

// fields is a lease's key, attempt and recovered, which tests compare.
func fields(l idem.Lease) idem.Lease {
	return idem.Lease{Key: l.Key, Attempt: l.Attempt, Recovered: l.Recovered}
}

// stalledHolder is a client whose link to idemd the test cuts once it holds a lease:
// its lease then runs out while its work goes on, as in a long pause.
func stalledHolder(t *testing.T) (*idem.Client, *cutTransport) {
	t.Helper()
	link := &cutTransport{}
	return newClient(t, idem.WithHTTPClient(&http.Client{Transport: link}), idem.WithRetries(0)), link
}

// takeOver runs Do for key until it gets the lease, which it can only once the
// holder's lease has run out; it returns the lease fn ran under and when fn started.
func takeOver(t *testing.T, c *idem.Client, key string) (idem.Lease, time.Time) {
	t.Helper()
	deadline := time.Now().Add(testenv.Scale(30 * time.Second))
	for {
		var got idem.Lease
		var at time.Time
		_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
			at = time.Now()
			l, ok := idem.LeaseFrom(ctx)
			if !ok {
				return idem.Response{}, errors.New("fn's context carries no lease")
			}
			got = l
			return idem.Response{Status: 200}, nil
		}, idem.DoOptions{Wait: time.Second})
		switch {
		case err == nil:
			return got, at
		case !errors.Is(err, idem.ErrInProgress):
			t.Fatalf("taking %q over: %v", key, err)
		case time.Now().After(deadline):
			t.Fatalf("%q was never taken over: %v", key, err)
		}
	}
}

func TestDoHandsTheLease(t *testing.T) {
	c := newClient(t)
	key := freshKey("do-lease")
	if _, ok := idem.LeaseFrom(t.Context()); ok {
		t.Fatal("a context outside Do carries a lease")
	}
	var none idem.Lease
	if none.Remaining() != 0 || !none.Deadline().IsZero() {
		t.Fatalf("a Lease no call handed out: remaining %s, deadline %s; want 0 and the zero time", none.Remaining(), none.Deadline())
	}
	var got idem.Lease
	var deadline, read time.Time
	var remaining time.Duration
	sent := time.Now()
	res, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		var ok bool
		if got, ok = idem.LeaseFrom(ctx); !ok {
			return idem.Response{}, errors.New("fn's context carries no lease")
		}
		deadline, remaining = got.Deadline(), got.Remaining()
		read = time.Now()
		return idem.Response{Status: 200}, nil
	})
	if err != nil || res.Replayed {
		t.Fatalf("Do: %+v %v", res, err)
	}
	if want := (idem.Lease{Key: key, Attempt: 1}); fields(got) != want {
		t.Fatalf("lease of a first claim: %+v, want %+v", got, want)
	}
	// The default lease is 30 s, of which the holder counts on 95 % from the claim's
	// send, which came between sent and read.
	const reckoned = 28500 * time.Millisecond
	if deadline.Before(sent.Add(reckoned)) || deadline.After(read.Add(reckoned)) || remaining <= 0 || remaining > reckoned {
		t.Fatalf("deadline %s (%s after the call) and %s remaining, want 28.5 s after the claim's send",
			deadline, deadline.Sub(sent), remaining)
	}

	// A key released by an error is acquired again with the next attempt, and that is
	// no recovery: the holder before gave it back.
	key = freshKey("once-lease")
	var leases []idem.Lease
	for range 2 {
		_ = c.Once(t.Context(), key, func(ctx context.Context) error {
			l, _ := idem.LeaseFrom(ctx)
			leases = append(leases, fields(l))
			return errors.New("transient")
		})
	}
	want := []idem.Lease{{Key: key, Attempt: 1}, {Key: key, Attempt: 2}}
	if fmt.Sprint(leases) != fmt.Sprint(want) {
		t.Fatalf("Once after a release: leases %+v, want %+v", leases, want)
	}
}

// TestDoRecoveredLease: a holder stalls past its lease; the caller that takes the key
// over runs with the next attempt and Recovered set, and the stalled holder's context
// ends with ErrLeaseLost.
func TestDoRecoveredLease(t *testing.T) {
	holder, link := stalledHolder(t)
	key := freshKey("do-recovered")
	holding := make(chan struct{})
	taken := make(chan idem.Lease, 1)
	var first idem.Lease
	var firstCause error
	done := make(chan error, 1)
	go func() {
		_, err := holder.Do(context.Background(), key, "", func(ctx context.Context) (idem.Response, error) {
			first, _ = idem.LeaseFrom(ctx)
			link.cut.Store(true)
			close(holding)
			<-taken
			link.cut.Store(false)
			// The lease's deadline passed before idemd let the key go.
			<-ctx.Done()
			firstCause = context.Cause(ctx)
			return idem.Response{Status: 200}, nil
		}, idem.DoOptions{Lease: 300 * time.Millisecond})
		done <- err
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("the first holder ended before it held the key: %v", err)
	}
	second, _ := takeOver(t, newClient(t), key)
	taken <- second
	err := <-done
	if want := (idem.Lease{Key: key, Attempt: 1}); fields(first) != want {
		t.Fatalf("the first holder's lease: %+v, want %+v", first, want)
	}
	if want := (idem.Lease{Key: key, Attempt: 2, Recovered: true}); fields(second) != want {
		t.Fatalf("the lease of the caller that took over: %+v, want %+v", second, want)
	}
	if !errors.Is(firstCause, idem.ErrLeaseLost) || !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the stalled holder: its context ended with %v and Do returned %v, want ErrLeaseLost", firstCause, err)
	}
}

// leaseSeen records the lease each request behind the middleware ran under.
type leaseSeen struct {
	mu     sync.Mutex
	leases []idem.Lease
	none   int
	hold   chan struct{}
}

func (h *leaseSeen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l, ok := idem.LeaseFrom(r.Context())
	h.mu.Lock()
	if ok {
		h.leases = append(h.leases, fields(l))
	} else {
		h.none++
	}
	first := len(h.leases) == 1
	h.mu.Unlock()
	if first && h.hold != nil {
		<-h.hold
	}
	w.WriteHeader(http.StatusCreated)
}

func (h *leaseSeen) seen() ([]idem.Lease, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]idem.Lease(nil), h.leases...), h.none
}

func TestMiddlewareHandsTheLease(t *testing.T) {
	t.Run("first request, replay, pass-through", func(t *testing.T) {
		h := &leaseSeen{}
		url := serve(t, h)
		key := freshKey("mw-lease")
		for range 2 {
			if r := send(t, url, "POST", key, "application/json", `{}`); r.status != 201 {
				t.Fatalf("POST: %+v", r)
			}
		}
		if r := send(t, url, "POST", "", "application/json", `{}`); r.status != 201 {
			t.Fatalf("POST without a key: %+v", r)
		}
		if r := send(t, url, "GET", key, "", ""); r.status != 201 {
			t.Fatalf("GET: %+v", r)
		}
		leases, none := h.seen()
		want := []idem.Lease{{Key: idem.MiddlewareKey("alice", key), Attempt: 1}}
		if fmt.Sprint(leases) != fmt.Sprint(want) || none != 2 {
			t.Fatalf("leases %+v and %d runs without one, want %+v and 2 (the replay does not run)", leases, none, want)
		}
	})

	t.Run("a request that takes over a stalled one", func(t *testing.T) {
		h := &leaseSeen{hold: make(chan struct{})}
		stalled, link := stalledHolder(t)
		stalledURL := serveWith(t, stalled, h, idem.WithLease(300*time.Millisecond))
		url := serve(t, h)
		key := freshKey("mw-recovered")
		first := make(chan reply, 1)
		go func() {
			r, _ := call{key: key, body: `{}`}.send(t, context.Background(), stalledURL)
			first <- r
		}()
		deadline := time.Now().Add(testenv.Scale(30 * time.Second))
		for {
			if leases, _ := h.seen(); len(leases) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the first request never ran")
			}
			time.Sleep(5 * time.Millisecond)
		}
		link.cut.Store(true)
		for {
			r := send(t, url, "POST", key, "application/json", `{}`)
			if r.status == 201 {
				break
			}
			if r.status != 409 || time.Now().After(deadline) {
				t.Fatalf("a retry while the first request stalls: %+v", r)
			}
			time.Sleep(20 * time.Millisecond)
		}
		link.cut.Store(false)
		close(h.hold)
		if r := <-first; r.status != 201 && r.status != 409 {
			t.Fatalf("the stalled request: %+v", r)
		}
		leases, _ := h.seen()
		ikey := idem.MiddlewareKey("alice", key)
		want := []idem.Lease{{Key: ikey, Attempt: 1}, {Key: ikey, Attempt: 2, Recovered: true}}
		if fmt.Sprint(leases) != fmt.Sprint(want) {
			t.Fatalf("leases %+v, want %+v", leases, want)
		}
	})

	t.Run("fail-open runs without a lease", func(t *testing.T) {
		d := ownDaemon(t)
		c, err := idem.New(d.URL, idem.WithRetries(0))
		if err != nil {
			t.Fatal(err)
		}
		h := &leaseSeen{}
		url := serveWith(t, c, h, idem.WithFailOpen(nil))
		d.Kill()
		if r := send(t, url, "POST", freshKey("mw-open"), "application/json", `{}`); r.status != 201 {
			t.Fatalf("fail open: %+v", r)
		}
		if leases, none := h.seen(); len(leases) != 0 || none != 1 {
			t.Fatalf("fail-open: leases %+v, %d runs without one; want none and 1", leases, none)
		}
	})
}
