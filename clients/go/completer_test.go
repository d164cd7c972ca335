package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// runCounts counts a handler's runs per key.
type runCounts struct {
	mu   sync.Mutex
	runs map[string]int
}

func (rc *runCounts) add(key string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.runs == nil {
		rc.runs = map[string]int{}
	}
	rc.runs[key]++
}

func (rc *runCounts) of(key string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.runs[key]
}

func (rc *runCounts) total() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, r := range rc.runs {
		n += r
	}
	return n
}

// abandon claims key with fingerprint under a short lease and never finishes it, as a
// holder that died; with a point name it records that point first.
func abandon(t *testing.T, c *idem.Client, key, fingerprint, point string) {
	t.Helper()
	cl, err := c.Claim(t.Context(), key, idem.ClaimOptions{Fingerprint: fingerprint, Lease: 150 * time.Millisecond})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("claim %s: %+v %v", key, cl, err)
	}
	if point != "" {
		if err := c.RecordRecoveryPoint(t.Context(), key, cl.Token, point, []byte("data of "+point)); err != nil {
			t.Fatal(err)
		}
	}
}

func newCompleter(t *testing.T, c *idem.Client, opts idem.CompleterOptions) *idem.Completer {
	t.Helper()
	cp, err := idem.NewCompleter(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// TestCompletersFinishEachKeyOnce: keys whose holders died, some with a recovery
// point and some with a fingerprint, are finished by two completers on two clients
// making a pass at the same time: each key's handler runs once in all, with the
// takeover's lease and the holder's point, and every key ends completed with the
// handler's result. A key held live by another caller under the same prefix is not
// run.
func TestCompletersFinishEachKeyOnce(t *testing.T) {
	holders := newClient(t)
	prefix := freshKey("complete") + "/"
	const n = 12
	var keys []string
	for i := range n {
		key := fmt.Sprintf("%sorder-%02d", prefix, i)
		keys = append(keys, key)
		fingerprint, point := "", ""
		if i%2 == 0 {
			fingerprint = "sha256:" + key
		}
		if i%3 == 0 {
			point = fmt.Sprintf("step-%d", i)
		}
		abandon(t, holders, key, fingerprint, point)
	}
	live := prefix + "live"
	if cl, err := holders.Claim(t.Context(), live, idem.ClaimOptions{Lease: time.Minute}); err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("the live claim: %+v %v", cl, err)
	}
	waitAbandoned(t, holders, prefix, keys...)

	var counts runCounts
	handler := func(ctx context.Context) (idem.Response, error) {
		l, ok := idem.LeaseFrom(ctx)
		if !ok {
			return idem.Response{}, errors.New("no lease in the handler's context")
		}
		counts.add(l.Key)
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(l.Key, prefix), "order-%d", &i); err != nil {
			return idem.Response{}, fmt.Errorf("a key not abandoned by the test: %q", l.Key)
		}
		p := l.RecoveryPoint
		switch {
		case !l.Recovered || l.Attempt != 2:
			return idem.Response{}, fmt.Errorf("%s: lease %+v, want recovered attempt 2", l.Key, l)
		case i%3 == 0 && (p == nil || p.Name != fmt.Sprintf("step-%d", i) || string(p.Data) != "data of "+p.Name || p.Attempt != 1):
			return idem.Response{}, fmt.Errorf("%s: point %+v, want step-%d of attempt 1", l.Key, p, i)
		case i%3 != 0 && p != nil:
			return idem.Response{}, fmt.Errorf("%s: point %+v, want none", l.Key, p)
		}
		return idem.Response{Status: 200, Body: []byte("finished " + l.Key)}, nil
	}
	var errs sync.Map
	opts := idem.CompleterOptions{Prefix: prefix, Concurrency: 3, Handler: handler,
		OnError: func(key string, err error) { errs.Store(key, err) }}
	completers := []*idem.Completer{newCompleter(t, newClient(t), opts), newCompleter(t, newClient(t), opts)}
	stats := make([]idem.CompleterStats, len(completers))
	var wg sync.WaitGroup
	for i, cp := range completers {
		wg.Go(func() {
			var err error
			stats[i], err = cp.RunOnce(t.Context())
			if err != nil {
				t.Errorf("completer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	errs.Range(func(k, v any) bool {
		t.Errorf("completer error for %q: %v", k, v)
		return true
	})

	var sum idem.CompleterStats
	for _, s := range stats {
		if s.Listed != s.Finished+s.Failed+s.Skipped+s.Errors {
			t.Errorf("stats %+v do not add up", s)
		}
		sum.Listed, sum.Finished, sum.Failed, sum.Skipped, sum.Errors = sum.Listed+s.Listed, sum.Finished+s.Finished, sum.Failed+s.Failed, sum.Skipped+s.Skipped, sum.Errors+s.Errors
	}
	if sum.Finished != n || sum.Failed != 0 || sum.Errors != 0 {
		t.Fatalf("the two passes: %+v, want %d finished in all", stats, n)
	}
	c := newClient(t)
	for _, key := range keys {
		if r := counts.of(key); r != 1 {
			t.Errorf("%s: the handler ran %d times", key, r)
		}
		rec, err := c.Lookup(t.Context(), key)
		if err != nil || rec.State != "completed" || rec.Attempt != 2 || rec.Response == nil || string(rec.Response.Body) != "finished "+key || rec.RecoveryPoint != nil {
			t.Errorf("%s: %+v %v, want completed by attempt 2 with the handler's result", key, rec, err)
		}
	}
	if r := counts.of(live); r != 0 {
		t.Errorf("the live key's handler ran %d times", r)
	}
	if rec, err := c.Lookup(t.Context(), live); err != nil || rec.State != "pending" || rec.Attempt != 1 {
		t.Errorf("the live key: %+v %v, want its holder's pending attempt 1", rec, err)
	}
	if s, err := completers[0].RunOnce(t.Context()); err != nil || s != (idem.CompleterStats{}) {
		t.Fatalf("a pass after all was finished: %+v %v, want nothing listed", s, err)
	}
}

// TestCompleterSkipsFailsAndLeavesPending: between the feed's answer and the
// completer's claims, another caller takes one listed key and finishes another: both
// are skipped and not run. A handler's PermanentError is stored as the key's failure;
// another error leaves the key pending (not released), and the feed lists it again
// once the completer's lease runs out.
func TestCompleterSkipsFailsAndLeavesPending(t *testing.T) {
	holders, other := newClient(t), newClient(t)
	prefix := freshKey("mixed") + "/"
	taken, finished, failing, permanent, fine := prefix+"taken", prefix+"finished", prefix+"failing", prefix+"permanent", prefix+"fine"
	for _, key := range []string{taken, finished, failing, permanent, fine} {
		abandon(t, holders, key, "", "")
	}
	waitAbandoned(t, holders, prefix, taken, finished, failing, permanent, fine)

	var interfered atomic.Bool
	rl := &relay{answered: func(resp *http.Response) {
		if resp.Request.URL.Path != "/v1/abandoned" || !interfered.CompareAndSwap(false, true) {
			return
		}
		ctx := context.Background()
		if cl, err := other.Claim(ctx, taken, idem.ClaimOptions{Lease: time.Minute}); err != nil || cl.Outcome != idem.Acquired {
			t.Errorf("the other caller's claim of %s: %+v %v", taken, cl, err)
		}
		cl, err := other.Claim(ctx, finished, idem.ClaimOptions{Lease: time.Minute})
		if err == nil {
			err = other.Complete(ctx, finished, cl.Token, idem.Response{Status: 200, Body: []byte("by the other caller")})
		}
		if err != nil {
			t.Errorf("the other caller finishing %s: %v", finished, err)
		}
	}}
	c, err := idem.New(rl.start(t, daemonURL))
	if err != nil {
		t.Fatal(err)
	}
	var counts runCounts
	var reported sync.Map
	const lease = 300 * time.Millisecond
	cp := newCompleter(t, c, idem.CompleterOptions{Prefix: prefix, Lease: lease,
		OnError: func(key string, err error) { reported.Store(key, err) },
		Handler: func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			counts.add(l.Key)
			switch l.Key {
			case failing:
				return idem.Response{}, errors.New("the refund provider is down")
			case permanent:
				return idem.Response{}, idem.Permanent(errors.New("the card is closed"), idem.Response{Status: 402, Body: []byte("declined")})
			}
			return idem.Response{Status: 201, Body: []byte("refunded")}, nil
		}})
	stats, err := cp.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (idem.CompleterStats{Listed: 5, Finished: 1, Failed: 1, Skipped: 2, Errors: 1}); stats != want {
		t.Fatalf("the pass: %+v, want %+v", stats, want)
	}
	for key, want := range map[string]int{taken: 0, finished: 0, failing: 1, permanent: 1, fine: 1} {
		if r := counts.of(key); r != want {
			t.Errorf("%s: the handler ran %d times, want %d", key, r, want)
		}
	}
	if v, ok := reported.Load(failing); !ok || !strings.Contains(v.(error).Error(), "the refund provider is down") {
		t.Errorf("OnError for %s: %v", failing, v)
	}

	lookup := func(key string) *idem.Record {
		rec, err := holders.Lookup(t.Context(), key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return rec
	}
	if rec := lookup(taken); rec.State != "pending" || rec.Attempt != 2 {
		t.Errorf("%s: %+v, want the other caller's pending attempt 2", taken, rec)
	}
	if rec := lookup(finished); rec.State != "completed" || string(rec.Response.Body) != "by the other caller" {
		t.Errorf("%s: %+v, want the other caller's result", finished, rec)
	}
	if rec := lookup(permanent); rec.State != "failed" || rec.Response == nil || rec.Response.Status != 402 || string(rec.Response.Body) != "declined" {
		t.Errorf("%s: %+v, want the stored failure", permanent, rec)
	}
	if rec := lookup(fine); rec.State != "completed" || string(rec.Response.Body) != "refunded" {
		t.Errorf("%s: %+v, want the handler's result", fine, rec)
	}
	if rec := lookup(failing); rec.State != "pending" || rec.Attempt != 2 {
		t.Fatalf("%s: %+v, want left pending by attempt 2", failing, rec)
	}
	// The failed key comes back to the feed once the completer's lease runs out, for a
	// later pass to try again.
	again := waitAbandoned(t, holders, prefix, failing)
	if again[0].Attempt != 2 {
		t.Fatalf("%s listed again as %+v, want attempt 2", failing, again[0])
	}
}

// TestCompleterRunStops: Run makes pass after pass, finishing keys abandoned after it
// started, while a handler that takes long runs beside them. When its context ends,
// Run cancels that handler's context, waits for it, and returns; the key it held stays
// pending, and nothing runs afterwards.
func TestCompleterRunStops(t *testing.T) {
	holders := newClient(t)
	prefix := freshKey("run") + "/"
	slow, quick, late := prefix+"slow", prefix+"quick", prefix+"late"
	var counts runCounts
	var inFlight atomic.Int32
	slowStarted := make(chan struct{})
	cp := newCompleter(t, newClient(t), idem.CompleterOptions{Prefix: prefix, Concurrency: 2, PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context) (idem.Response, error) {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			l, _ := idem.LeaseFrom(ctx)
			counts.add(l.Key)
			if l.Key == slow {
				close(slowStarted)
				<-ctx.Done()
				return idem.Response{}, context.Cause(ctx)
			}
			return idem.Response{Status: 200, Body: []byte(l.Key)}, nil
		}})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	returned := make(chan error, 1)
	go func() { returned <- cp.Run(ctx) }()

	abandon(t, holders, slow, "", "")
	select {
	case <-slowStarted:
	case err := <-returned:
		t.Fatalf("Run returned %v before the slow key was run", err)
	case <-time.After(testenv.Scale(30 * time.Second)):
		t.Fatal("the slow key was not run in time")
	}
	abandon(t, holders, quick, "", "")
	testenv.WaitFor(t, 30*time.Second, "a later pass to finish the quick key", func() bool {
		rec, err := holders.Lookup(t.Context(), quick)
		return err == nil && rec.State == "completed"
	})

	stop()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatalf("Run: %v, want nil once stopped", err)
		}
	case <-time.After(testenv.Scale(30 * time.Second)):
		t.Fatal("Run did not return in time after being stopped")
	}
	if n := inFlight.Load(); n != 0 {
		t.Fatalf("Run returned with %d handlers still running", n)
	}
	if rec, err := holders.Lookup(t.Context(), slow); err != nil || rec.State != "pending" || rec.Attempt != 2 {
		t.Fatalf("the slow key after the stop: %+v %v, want left pending by the completer's attempt 2", rec, err)
	}
	runs := counts.total()
	abandon(t, holders, late, "", "")
	waitAbandoned(t, holders, prefix, late)
	if n := counts.total(); n != runs || counts.of(late) != 0 {
		t.Fatalf("the handler ran %d times after Run returned", n-runs)
	}
	if rec, err := holders.Lookup(t.Context(), late); err != nil || rec.State != "pending" || rec.Attempt != 1 {
		t.Fatalf("the key abandoned after the stop: %+v %v, want its holder's attempt 1", rec, err)
	}
}

// TestCompleterRunWaitsOutAnOutage: while idemd cannot be reached, Run does not return;
// it tries again less and less often (more than its poll interval apart), reporting
// each failed pass, and finishes keys once idemd is back.
func TestCompleterRunWaitsOutAnOutage(t *testing.T) {
	link := &cutTransport{}
	link.cut.Store(true)
	c := newClient(t, idem.WithHTTPClient(&http.Client{Transport: link}), idem.WithRetries(0))
	prefix := freshKey("outage") + "/"
	var mu sync.Mutex
	var failures []time.Time
	var other []error
	cp := newCompleter(t, c, idem.CompleterOptions{Prefix: prefix, PollInterval: 20 * time.Millisecond,
		OnError: func(key string, err error) {
			mu.Lock()
			defer mu.Unlock()
			if key == "" && errors.Is(err, idem.ErrUnavailable) {
				failures = append(failures, time.Now())
			} else {
				other = append(other, err)
			}
		},
		Handler: func(ctx context.Context) (idem.Response, error) {
			return idem.Response{Status: 200, Body: []byte("after")}, nil
		}})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	returned := make(chan error, 1)
	go func() { returned <- cp.Run(ctx) }()

	testenv.WaitFor(t, 30*time.Second, "three passes to fail", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failures) >= 3
	})
	select {
	case err := <-returned:
		t.Fatalf("Run returned %v while idemd could not be reached", err)
	default:
	}
	mu.Lock()
	// The third pass came after a wait drawn from [250 ms, 500 ms], the backoff's
	// second step: far longer than the poll interval.
	gap := failures[2].Sub(failures[1])
	mu.Unlock()
	if gap < 250*time.Millisecond {
		t.Fatalf("the third pass came %s after the second, want a backoff of at least 250 ms", gap)
	}

	holders := newClient(t)
	key := prefix + "k"
	abandon(t, holders, key, "", "")
	link.cut.Store(false)
	testenv.WaitFor(t, 60*time.Second, "the completer to finish the key once idemd is back", func() bool {
		rec, err := holders.Lookup(t.Context(), key)
		return err == nil && rec.State == "completed" && string(rec.Response.Body) == "after"
	})
	stop()
	if err := <-returned; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(other) != 0 {
		t.Fatalf("other errors: %v", other)
	}
}

// TestNewCompleterRefuses options that would finish keys nobody chose, or that idemd
// would refuse.
func TestNewCompleterRefuses(t *testing.T) {
	c := newClient(t)
	h := func(context.Context) (idem.Response, error) { return idem.Response{Status: 200}, nil }
	for _, tc := range []struct {
		name string
		opts idem.CompleterOptions
	}{
		{"no prefix", idem.CompleterOptions{Handler: h}},
		{"a prefix and AllKeys", idem.CompleterOptions{Prefix: "a/", AllKeys: true, Handler: h}},
		{"no handler", idem.CompleterOptions{Prefix: "a/"}},
		{"a prefix over 255 bytes", idem.CompleterOptions{Prefix: strings.Repeat("p", 256), Handler: h}},
		{"a prefix not UTF-8", idem.CompleterOptions{Prefix: "a\xff", Handler: h}},
		{"a lease too short", idem.CompleterOptions{Prefix: "a/", Lease: 50 * time.Millisecond, Handler: h}},
		{"a negative concurrency", idem.CompleterOptions{Prefix: "a/", Concurrency: -1, Handler: h}},
	} {
		if _, err := idem.NewCompleter(c, tc.opts); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := idem.NewCompleter(c, idem.CompleterOptions{AllKeys: true, Handler: h}); err != nil {
		t.Errorf("every key, asked for: %v", err)
	}
}
