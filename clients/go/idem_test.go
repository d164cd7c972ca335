package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// daemonURL is a real idemd shared by the tests and the examples; binary and tmp let
// tests start daemons of their own.
var (
	daemonURL string
	binary    string
	tmp       string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, cleanup, err := testenv.TempDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	tmp = dir
	if binary, err = testenv.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d, err := testenv.Start(binary, filepath.Join(dir, "shared"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer d.Kill()
	daemonURL = d.URL
	return m.Run()
}

var keySeq atomic.Int64

func freshKey(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), keySeq.Add(1))
}

func newClient(t *testing.T, opts ...idem.Option) *idem.Client {
	t.Helper()
	c, err := idem.New(daemonURL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ownDaemon starts a daemon for one test, so that the test may kill it.
func ownDaemon(t *testing.T, args ...string) *testenv.Daemon {
	t.Helper()
	d, err := testenv.Start(binary, t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	return d
}

func TestClaimCompleteReplay(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	key := freshKey("lifecycle")
	// The daemon's clock counts whole milliseconds.
	before := time.Now().Add(-time.Millisecond)
	cl, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp-1", Lease: 20 * time.Second})
	if err != nil || cl.Outcome != idem.Acquired || cl.Attempt != 1 || len(cl.Token) != 32 {
		t.Fatalf("first claim: %+v %v", cl, err)
	}
	if cl.LeaseExpiresAt.Before(before.Add(20*time.Second)) || cl.LeaseExpiresAt.After(time.Now().Add(20*time.Second)) {
		t.Fatalf("lease runs out at %s, want 20s after the claim", cl.LeaseExpiresAt)
	}

	_, err = c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp-1"})
	left := time.Until(cl.LeaseExpiresAt)
	var p *idem.Problem
	if !errors.Is(err, idem.ErrInProgress) || !errors.As(err, &p) || p.Status != 409 || p.RetryAfter < left || p.RetryAfter > 20*time.Second {
		t.Fatalf("second claim: %v (%+v), want ErrInProgress with the %s left of the lease to wait", err, p, left)
	}
	if _, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp-2"}); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("claim with another fingerprint: %v", err)
	}

	before = time.Now().Add(-time.Millisecond)
	until, err := c.Extend(ctx, key, cl.Token, time.Minute)
	if err != nil || until.Before(before.Add(time.Minute)) || until.After(time.Now().Add(time.Minute)) {
		t.Fatalf("extend: %s %v", until, err)
	}
	body := []byte("\x00binary\xffbody")
	want := idem.Response{Status: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: body}
	if err := c.Complete(ctx, key, "0123456789abcdef0123456789abcdef", want); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with a wrong token: %v", err)
	}
	if err := c.Complete(ctx, key, cl.Token, want); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, key, cl.Token, want); err != nil {
		t.Fatalf("a repeated complete: %v", err)
	}

	again, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp-1"})
	if err != nil || again.Outcome != idem.Completed || again.Response.Status != 201 ||
		!bytes.Equal(again.Response.Body, body) || again.Response.Header.Get("Location") != "/orders/1" {
		t.Fatalf("replay: %+v %v", again, err)
	}
	rec, err := c.Lookup(ctx, key)
	if err != nil || rec.State != "completed" || rec.Key != key || rec.Fingerprint != "fp-1" || !bytes.Equal(rec.Response.Body, body) {
		t.Fatalf("lookup: %+v %v", rec, err)
	}
	if err := c.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("lookup after purge: %v", err)
	}
}

func TestReleaseModes(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	key := freshKey("release")
	cl, err := c.Claim(ctx, key, idem.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, key, cl.Token, idem.Retry, nil); err != nil {
		t.Fatal(err)
	}
	cl, err = c.Claim(ctx, key, idem.ClaimOptions{})
	if err != nil || cl.Outcome != idem.Acquired || cl.Attempt != 2 {
		t.Fatalf("claim after a retry release: %+v %v", cl, err)
	}
	if err := c.Release(ctx, key, cl.Token, idem.Fail, &idem.Response{Status: 402, Body: []byte("declined")}); err != nil {
		t.Fatal(err)
	}
	cl, err = c.Claim(ctx, key, idem.ClaimOptions{})
	if err != nil || cl.Outcome != idem.Failed || cl.Response.Status != 402 || string(cl.Response.Body) != "declined" {
		t.Fatalf("claim after a fail release: %+v %v", cl, err)
	}
}

// dropFirst is a proxy in front of the daemon that lets the first claim reach the
// daemon, then cuts the connection before the answer gets back.
func dropFirst(t *testing.T, target string) (url string, claims *atomic.Int32) {
	t.Helper()
	claims = &atomic.Int32{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if r.URL.Path == "/v1/claim" && claims.Add(1) == 1 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(hs.Close)
	return hs.URL, claims
}

// TestResentClaimGetsTheSameLease loses the answer to a claim that the daemon did
// acquire: the client resends it with the same claim secret and gets the lease, not 409.
func TestResentClaimGetsTheSameLease(t *testing.T) {
	url, claims := dropFirst(t, daemonURL)
	c, err := idem.New(url, idem.WithOwner("worker-7"))
	if err != nil {
		t.Fatal(err)
	}
	key := freshKey("resent")
	cl, err := c.Claim(t.Context(), key, idem.ClaimOptions{})
	if err != nil || cl.Outcome != idem.Acquired || cl.Attempt != 1 {
		t.Fatalf("claim through a connection cut once: %+v %v", cl, err)
	}
	if n := claims.Load(); n != 2 {
		t.Fatalf("the daemon saw %d claims, want the first and one resend", n)
	}
	rec, err := newClient(t).Lookup(t.Context(), key)
	if err != nil || rec.Owner != "worker-7" || rec.Attempt != 1 {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if err := c.Complete(t.Context(), key, cl.Token, idem.Response{Status: 200}); err != nil {
		t.Fatalf("complete with the resent claim's token: %v", err)
	}
}

// TestSameOwnerNameSharesNoLease: two deliveries of one job, named alike by their
// owner, must not both acquire; the owner is a label, not a credential.
func TestSameOwnerNameSharesNoLease(t *testing.T) {
	key := freshKey("same-owner")
	first, second := newClient(t, idem.WithOwner("job-42")), newClient(t, idem.WithOwner("job-42"))
	if cl, err := first.Claim(t.Context(), key, idem.ClaimOptions{Owner: "job-42"}); err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("first delivery: %+v %v", cl, err)
	}
	if cl, err := second.Claim(t.Context(), key, idem.ClaimOptions{Owner: "job-42"}); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("second delivery with the same owner: %+v %v, want ErrInProgress", cl, err)
	}
}

func TestUnavailable(t *testing.T) {
	d := ownDaemon(t)
	c, err := idem.New(d.URL, idem.WithRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	d.Kill()
	_, err = c.Claim(t.Context(), freshKey("down"), idem.ClaimOptions{})
	if !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("claim with the daemon down: %v, want ErrUnavailable", err)
	}
}

func TestToken(t *testing.T) {
	token := "a-test-token-with-enough-entropy-0123456789"
	sum := sha256.Sum256([]byte(token))
	file := filepath.Join(t.TempDir(), "auth.yaml")
	cfg := fmt.Sprintf("tenants:\n  team: {}\ntokens:\n  - tenant: team\n    scopes: [use]\n    sha256: %s\n", hex.EncodeToString(sum[:]))
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	d := ownDaemon(t, "--auth-file", file)
	anonymous, _ := idem.New(d.URL)
	var p *idem.Problem
	if _, err := anonymous.Claim(t.Context(), "k", idem.ClaimOptions{}); !errors.As(err, &p) || p.Status != 401 || p.Code != "unauthenticated" {
		t.Fatalf("claim without a token: %v", err)
	}
	c, _ := idem.New(d.URL, idem.WithToken(token))
	cl, err := c.Claim(t.Context(), "k", idem.ClaimOptions{})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("claim with the token: %+v %v", cl, err)
	}
	if err := c.Purge(t.Context(), "k"); !errors.As(err, &p) || p.Status != 403 || p.Code != "forbidden" {
		t.Fatalf("purge without the admin scope: %v", err)
	}
}

func TestDo(t *testing.T) {
	c := newClient(t)
	key := freshKey("do")
	var runs atomic.Int32
	fn := func(ctx context.Context) (idem.Response, error) {
		n := runs.Add(1)
		return idem.Response{Status: 201, Body: []byte(fmt.Sprintf("run %d", n))}, nil
	}
	first, err := c.Do(t.Context(), key, "fp", fn)
	if err != nil || first.Replayed || string(first.Body) != "run 1" {
		t.Fatalf("first Do: %+v %v", first, err)
	}
	second, err := c.Do(t.Context(), key, "fp", fn)
	if err != nil || !second.Replayed || string(second.Body) != "run 1" || second.Status != 201 {
		t.Fatalf("second Do: %+v %v", second, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times", n)
	}
}

func TestDoConcurrent(t *testing.T) {
	c := newClient(t)
	key := freshKey("do-concurrent")
	var runs atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	results := make(chan string, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
				runs.Add(1)
				<-release
				return idem.Response{Status: 200, Body: []byte("once")}, nil
			}, idem.DoOptions{Wait: 20 * time.Second})
			if err != nil {
				t.Error(err)
				return
			}
			results <- string(res.Body)
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "the first run to start", func() bool { return runs.Load() == 1 })
	close(release)
	wg.Wait()
	close(results)
	for body := range results {
		if body != "once" {
			t.Errorf("a caller got %q", body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times for 20 concurrent callers", n)
	}
}

func TestDoReleasesOnErrorAndPanic(t *testing.T) {
	c := newClient(t)
	key := freshKey("do-errors")
	boom := errors.New("boom")
	if _, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		return idem.Response{}, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Do with a failing fn: %v", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "panicked" {
				t.Fatalf("recovered %v, want the fn's panic", r)
			}
		}()
		_, _ = c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) { panic("panicked") })
	}()
	res, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		return idem.Response{Status: 200, Body: []byte("third time")}, nil
	})
	if err != nil || res.Replayed || string(res.Body) != "third time" {
		t.Fatalf("Do after an error and a panic: %+v %v", res, err)
	}
	rec, err := c.Lookup(t.Context(), key)
	if err != nil || rec.Attempt != 3 {
		t.Fatalf("record after three runs: %+v %v", rec, err)
	}
}

func TestDoPermanentFailure(t *testing.T) {
	c := newClient(t)
	key := freshKey("do-permanent")
	declined := errors.New("card declined")
	_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		return idem.Response{}, idem.Permanent(declined, idem.Response{Status: 402, Body: []byte("declined")})
	})
	if !errors.Is(err, declined) {
		t.Fatalf("Do with a permanent failure: %v", err)
	}
	res, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		t.Error("fn ran again after a permanent failure")
		return idem.Response{}, nil
	})
	if !errors.Is(err, idem.ErrFailed) || !res.Replayed || res.Status != 402 || string(res.Body) != "declined" {
		t.Fatalf("Do after a permanent failure: %+v %v", res, err)
	}
}

// TestDoExtendsTheLease runs fn for several leases: the background renewal must keep
// other callers out the whole time.
func TestDoExtendsTheLease(t *testing.T) {
	c := newClient(t)
	other := newClient(t)
	key := freshKey("do-extend")
	const lease = time.Second
	res, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		end := time.Now().Add(3 * lease)
		probes := 0
		for time.Now().Before(end) {
			if _, err := other.Claim(ctx, key, idem.ClaimOptions{}); !errors.Is(err, idem.ErrInProgress) {
				return idem.Response{}, fmt.Errorf("another caller's claim while fn runs: %v", err)
			}
			probes++
			select {
			case <-ctx.Done():
				return idem.Response{}, ctx.Err()
			case <-time.After(lease / 4):
			}
		}
		return idem.Response{Status: 200, Body: []byte(fmt.Sprint(probes))}, nil
	}, idem.DoOptions{Lease: lease})
	if err != nil || res.Status != 200 {
		t.Fatalf("Do over three leases: %+v %v", res, err)
	}
}

func TestOnce(t *testing.T) {
	c := newClient(t)
	key := idem.MessageKey("orders", "partition-3", freshKey("msg"))
	var runs atomic.Int32
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Once(t.Context(), key, func(ctx context.Context) error {
				runs.Add(1)
				return nil
			}, idem.DoOptions{Wait: 20 * time.Second})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("a message delivered 10 times ran %d times", n)
	}
}

func TestMessageKey(t *testing.T) {
	if idem.MessageKey("ab", "c") == idem.MessageKey("a", "bc") {
		t.Fatal("MessageKey does not separate its parts")
	}
	if idem.MessageKey("a", "b") != idem.MessageKey("a", "b") {
		t.Fatal("MessageKey is not stable")
	}
	if k := idem.MessageKey(strings.Repeat("x", 10000)); len(k) > 255 {
		t.Fatalf("MessageKey is %d bytes, over idemd's limit", len(k))
	}
}

// TestDoLeaseLost purges the key while fn runs: the next renewal finds the lease gone,
// fn's context is cancelled, and Do reports ErrLeaseLost instead of storing a result.
func TestDoLeaseLost(t *testing.T) {
	c := newClient(t)
	key := freshKey("do-lost")
	// The purge is the test's, not fn's work: it is not cut short when the lease runs
	// out. The lease is long enough for a renewal to be answered on a busy machine, so
	// that Do learns the lease was lost, rather than that it ran out unanswered.
	_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		if err := newClient(t).Purge(t.Context(), key); err != nil {
			return idem.Response{}, err
		}
		select {
		case <-ctx.Done():
			return idem.Response{}, ctx.Err()
		case <-time.After(testenv.Scale(20 * time.Second)):
			return idem.Response{}, errors.New("fn's context was not cancelled after the lease was lost")
		}
	}, idem.DoOptions{Lease: testenv.Scale(3 * time.Second)})
	// fn's own error, its context's, comes with the lease's.
	if !errors.Is(err, idem.ErrLeaseLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do after the key was purged: %v, want ErrLeaseLost and fn's context.Canceled", err)
	}
	if _, err := c.Lookup(t.Context(), key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a result was stored after the lease was lost: %v", err)
	}
}

// TestDoKeepsTheLeaseAfterTheCallerCancels: fn's context is cancelled with the
// caller's, but fn may still be finishing work it cannot stop; until it returns the
// lease must be renewed, or another caller takes the key over and runs it again.
func TestDoKeepsTheLeaseAfterTheCallerCancels(t *testing.T) {
	c := newClient(t)
	other := newClient(t)
	key := freshKey("do-cancel")
	const lease = 1500 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	res, err := c.Do(ctx, key, "", func(fnCtx context.Context) (idem.Response, error) {
		cancel()
		<-fnCtx.Done()
		// The work goes on past the lease held when the caller left.
		rec, err := other.Lookup(t.Context(), key)
		if err != nil {
			return idem.Response{}, err
		}
		deadline := time.Now().Add(testenv.Scale(20 * time.Second))
		for !time.Now().After(rec.LeaseExpiresAt.Add(100 * time.Millisecond)) {
			if time.Now().After(deadline) {
				return idem.Response{}, fmt.Errorf("lease_expires_at %s is not near", rec.LeaseExpiresAt)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cl, err := other.Claim(t.Context(), key, idem.ClaimOptions{}); !errors.Is(err, idem.ErrInProgress) {
			return idem.Response{}, fmt.Errorf("another caller's claim while fn still runs after its caller left: %+v %v, want ErrInProgress", cl, err)
		}
		return idem.Response{Status: 200}, nil
	}, idem.DoOptions{Lease: lease})
	if err != nil || res.Status != 200 {
		t.Fatalf("Do whose caller left while fn ran: %+v %v", res, err)
	}
}

// roundTripperFunc is a RoundTripper made of a function.
type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNewWithAWrappedDefaultTransport: programs replace http.DefaultTransport with a
// wrapper (instrumentation, HTTP mocking in their tests); a client built there must
// still work.
func TestNewWithAWrappedDefaultTransport(t *testing.T) {
	original := http.DefaultTransport
	t.Cleanup(func() { http.DefaultTransport = original })
	http.DefaultTransport = roundTripperFunc(original.RoundTrip)
	var c *idem.Client
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("idem.New panicked: %v", p)
			}
		}()
		var err error
		if c, err = idem.New(daemonURL); err != nil {
			t.Fatal(err)
		}
	}()
	if cl, err := c.Claim(t.Context(), freshKey("wrapped"), idem.ClaimOptions{}); err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v %v", cl, err)
	}
}

// TestNoTimeout: WithTimeout(0) leaves calls unbounded; the calls that finish a key
// must still be made, or the work runs and its result is lost.
func TestNoTimeout(t *testing.T) {
	c := newClient(t, idem.WithTimeout(0))
	key := freshKey("no-timeout")
	var runs atomic.Int64
	if res, err := c.Do(t.Context(), key, "fp", countingWork(&runs)); err != nil || res.Status != 201 {
		t.Fatalf("Do: %+v %v", res, err)
	}
	if rec, err := newClient(t).Lookup(t.Context(), key); err != nil || rec.State != "completed" {
		t.Fatalf("record after Do: %+v %v", rec, err)
	}

	var inc incidents
	h := &orders{}
	url := serveWith(t, c, h, inc.option())
	mwKey := freshKey("no-timeout-mw")
	for range 2 {
		if r := (call{key: mwKey, body: `{"amount":1}`}).do(t, url); r.status != 201 {
			t.Fatalf("answer: %+v", r)
		}
	}
	if n := h.runs.Load(); n != 1 || len(inc.seen) != 0 {
		t.Fatalf("two requests with one key ran the handler %d times; incidents %v", n, &inc)
	}
}
