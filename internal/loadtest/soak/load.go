package soak

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// maxLatencies bounds the latencies kept for one interval's p99; past it a reservoir
// keeps a uniform sample of them.
const maxLatencies = 100_000

// stats is what the load saw during one sampling interval.
type stats struct {
	mu        sync.Mutex
	calls     int64
	latencies []time.Duration
	errors    map[string]int64
	// ops counts what each kind of operation achieved (completions acknowledged,
	// waiters that hung up, takeovers, ...), to show that every path ran.
	ops map[string]int64
	// anomalies counts answers the contract rules out and no fault explains.
	anomalies map[string]int64
}

func newStats() *stats {
	return &stats{errors: map[string]int64{}, ops: map[string]int64{}, anomalies: map[string]int64{}}
}

func (s *stats) latency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if len(s.latencies) < maxLatencies {
		s.latencies = append(s.latencies, d)
	} else if i := rand.Int64N(s.calls); i < maxLatencies {
		s.latencies[i] = d
	}
}

// count adds one to a counter of the interval in progress; which picks the map under
// the lock, since swap replaces the maps.
func (s *stats) count(which func(*stats) map[string]int64, name string) {
	s.mu.Lock()
	which(s)[name]++
	s.mu.Unlock()
}

func (s *stats) op(name string) { s.count(func(s *stats) map[string]int64 { return s.ops }, name) }
func (s *stats) anomaly(name string) {
	s.count(func(s *stats) map[string]int64 { return s.anomalies }, name)
}
func (s *stats) fail(code string) { s.count(func(s *stats) map[string]int64 { return s.errors }, code) }

// swap returns the interval's stats and starts a new interval.
func (s *stats) swap() (calls int64, p99 time.Duration, errs, ops, anomalies map[string]int64) {
	var lat []time.Duration
	s.mu.Lock()
	calls, lat, errs, ops, anomalies = s.calls, s.latencies, s.errors, s.ops, s.anomalies
	s.calls, s.latencies = 0, nil
	s.errors, s.ops, s.anomalies = map[string]int64{}, map[string]int64{}, map[string]int64{}
	s.mu.Unlock()
	if len(lat) > 0 {
		slices.Sort(lat)
		p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return calls, p99, errs, ops, anomalies
}

// load drives idemd from many clients.
type load struct {
	base      string
	prefix    string
	http      *http.Client
	stats     *stats
	book      *ackBook
	retention time.Duration
	// The completions of the first keepFirst after start are kept for longKeep,
	// longer than the run, so that every sample checks them again.
	start     time.Time
	keepFirst time.Duration
	longKeep  time.Duration
	seq       atomic.Int64

	surprisesMu sync.Mutex
	surprises   []string
}

// response is a stored response as the wire carries it.
type response struct {
	Status int    `json:"status"`
	Body   []byte `json:"body,omitempty"`
}

type claimAnswer struct {
	Outcome       string    `json:"outcome"`
	LeaseToken    string    `json:"lease_token"`
	Attempt       int64     `json:"attempt"`
	Recovered     bool      `json:"recovered"`
	Response      *response `json:"response"`
	RecoveryPoint *struct {
		Name string `json:"name"`
	} `json:"recovery_point"`
}

type keyRecord struct {
	State    string    `json:"state"`
	Response *response `json:"response"`
}

type problem struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// neverSent are the problem codes the contract says no client receives: a caller
// that hung up gets no answer, and an internal error is a defect.
var neverSent = map[string]bool{"client_closed_request": true, "internal": true}

// maxSurprises bounds the answers the report describes in full.
const maxSurprises = 20

// surprise records an answer the contract rules out, with what was asked, so that it
// can be looked into.
func (l *load) surprise(what string) {
	l.surprisesMu.Lock()
	defer l.surprisesMu.Unlock()
	if len(l.surprises) < maxSurprises {
		l.surprises = append(l.surprises, time.Since(l.start).Round(time.Millisecond).String()+" "+what)
	}
}

// errHungUp is a call the load cancelled on purpose.
var errHungUp = errors.New("hung up")

// call sends one request and decodes a 2xx answer into out. It returns the status
// and, for a problem, its code. A status not in want counts as an error of the
// interval under its problem code (or "status_N"), and so does a transport error
// (as "transport"). timed says whether the call's latency counts towards the p99
// (a claim that waits on purpose does not).
func (l *load) call(ctx context.Context, method, path string, body any, out any, timed bool, want ...int) (int, string, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, "", err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, l.base+path, rd)
	if err != nil {
		return 0, "", err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	began := time.Now()
	resp, err := l.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", errHungUp
		}
		l.stats.fail("transport")
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if timed {
		l.stats.latency(time.Since(began))
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", errHungUp
		}
		l.stats.fail("transport")
		return 0, "", err
	}
	var code string
	if resp.StatusCode >= 400 {
		var p problem
		_ = json.Unmarshal(b, &p)
		code = p.Code
		if code == "" {
			code = "status_" + strconv.Itoa(resp.StatusCode)
		}
		if neverSent[code] || (resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable) {
			l.stats.anomaly("answered_" + code)
			l.surprise(fmt.Sprintf("%s %s answered %d %s after %s: %s", method, req.URL.Path, resp.StatusCode, code,
				time.Since(began).Round(time.Millisecond), p.Detail))
		}
	} else if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			l.stats.anomaly("undecodable_answer")
			return resp.StatusCode, "", err
		}
	}
	if !slices.Contains(want, resp.StatusCode) {
		if code == "" {
			code = "status_" + strconv.Itoa(resp.StatusCode)
		}
		l.stats.fail(code)
	}
	return resp.StatusCode, code, nil
}

// retryable says whether a failed call may be sent again unchanged: the store was
// unavailable or the connection failed, as the faults make happen.
func retryable(status int, err error) bool {
	return (err != nil && !errors.Is(err, errHungUp)) || status == http.StatusServiceUnavailable
}

// persist sends a call until it is answered with something other than a fault, at
// most a few times, pausing between tries as a client honouring Retry-After would.
// Resending a claim with its claim_secret, a completion or a release is safe: the
// contract answers a repeat as the first.
func (l *load) persist(ctx context.Context, method, path string, body, out any, want ...int) (int, string, error) {
	var (
		status int
		code   string
		err    error
	)
	for attempt := 0; attempt < 8; attempt++ {
		status, code, err = l.call(ctx, method, path, body, out, true, want...)
		if !retryable(status, err) {
			return status, code, err
		}
		if !pause(ctx, time.Duration(250<<min(attempt, 3))*time.Millisecond) {
			return status, code, ctx.Err()
		}
	}
	return status, code, err
}

// pause waits d or until ctx ends; it reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func secret() string {
	b := make([]byte, 16)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

func (l *load) key(kind string) string {
	return l.prefix + kind + "-" + strconv.FormatInt(l.seq.Add(1), 10)
}

func fingerprint(key string) string { return "fp:" + key }

func result(key string) []byte { return []byte("result of " + key) }

// acquire claims key for a holder with the given lease, resending with the same
// claim_secret after a fault. It reports the answer when the claim acquired.
func (l *load) acquire(ctx context.Context, key, fp string, lease time.Duration) (claimAnswer, bool) {
	var a claimAnswer
	status, _, err := l.persist(ctx, "POST", "/v1/claim", map[string]any{
		"key": key, "fingerprint": fp, "claim_secret": secret(), "lease_ms": lease.Milliseconds(),
	}, &a, http.StatusCreated)
	return a, err == nil && status == http.StatusCreated
}

// complete stores key's result under token and, once idemd acknowledges it, enters it
// in the book.
func (l *load) complete(ctx context.Context, key, token string) bool {
	body := map[string]any{"key": key, "lease_token": token,
		"response": response{Status: 201, Body: result(key)}}
	retention := l.retention
	long := time.Since(l.start) < l.keepFirst
	if long {
		retention = l.longKeep
		body["retention_ms"] = retention.Milliseconds()
	}
	// The record cannot have been stored before the first send, so it is kept at
	// least until then plus its retention; a second of slack covers Redis's expiry.
	sent := time.Now()
	status, _, err := l.persist(ctx, "POST", "/v1/complete", body, nil, http.StatusOK)
	if err != nil || status != http.StatusOK {
		return false
	}
	l.book.add(ack{key: key, body: result(key), until: sent.Add(retention - time.Second)}, long)
	l.stats.op("completed")
	return true
}

// cycle is the common case: claim a fresh key, sometimes record a recovery point,
// complete it.
func (l *load) cycle(ctx context.Context) {
	key := l.key("c")
	a, ok := l.acquire(ctx, key, fingerprint(key), 10*time.Second)
	if !ok {
		return
	}
	if rand.IntN(4) == 0 {
		l.recoveryPoint(ctx, key, a.LeaseToken)
	}
	l.complete(ctx, key, a.LeaseToken)
}

func (l *load) recoveryPoint(ctx context.Context, key, token string) bool {
	status, _, err := l.persist(ctx, "POST", "/v1/recovery-point", map[string]any{
		"key": key, "lease_token": token, "name": "charged", "data": []byte("charge-" + key),
	}, nil, http.StatusOK)
	if err == nil && status == http.StatusOK {
		l.stats.op("recovery_point")
		return true
	}
	return false
}

// replay claims a key idemd acknowledged as completed, with its fingerprint: the
// answer must be its stored result.
func (l *load) replay(ctx context.Context) {
	a, ok := l.book.pick(time.Now().Add(2 * time.Second))
	if !ok {
		l.cycle(ctx)
		return
	}
	var ans claimAnswer
	status, _, err := l.call(ctx, "POST", "/v1/claim", map[string]any{
		"key": a.key, "fingerprint": fingerprint(a.key), "claim_secret": secret(),
	}, &ans, true, http.StatusOK)
	switch {
	case err != nil:
	case status == http.StatusOK && ans.Outcome == "completed" && ans.Response != nil && bytes.Equal(ans.Response.Body, a.body):
		l.stats.op("replayed")
	case status == http.StatusOK || status == http.StatusCreated:
		// A completed key within its retention that is acquired again, or replays
		// something else, has lost its acknowledged result.
		l.book.lose(a, fmt.Sprintf("a replay answered %d %s", status, ans.Outcome))
	}
}

// mismatch claims a completed key with another fingerprint: the answer must be 422.
func (l *load) mismatch(ctx context.Context) {
	a, ok := l.book.pick(time.Now().Add(2 * time.Second))
	if !ok {
		l.cycle(ctx)
		return
	}
	var ans claimAnswer
	status, _, err := l.call(ctx, "POST", "/v1/claim", map[string]any{
		"key": a.key, "fingerprint": "another payload", "claim_secret": secret(),
	}, &ans, true, http.StatusUnprocessableEntity)
	switch {
	case err != nil:
	case status == http.StatusUnprocessableEntity:
		l.stats.op("mismatch_refused")
	case status == http.StatusCreated:
		l.book.lose(a, "a claim with another fingerprint acquired it")
	case status == http.StatusOK:
		l.stats.anomaly("mismatch_replayed")
	}
}

// waiters has a holder finish a key while two claims wait on it with wait_ms: one
// hangs up mid-wait, the other waits for the result.
func (l *load) waiters(ctx context.Context) {
	key := l.key("w")
	a, ok := l.acquire(ctx, key, fingerprint(key), 10*time.Second)
	if !ok {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		hctx, cancel := context.WithTimeout(ctx, time.Duration(50+rand.IntN(400))*time.Millisecond)
		defer cancel()
		_, _, err := l.call(hctx, "POST", "/v1/claim", map[string]any{
			"key": key, "fingerprint": fingerprint(key), "wait_ms": 10000,
		}, nil, false, http.StatusOK)
		if errors.Is(err, errHungUp) {
			l.stats.op("waiter_hung_up")
		}
	}()
	go func() {
		defer wg.Done()
		var ans claimAnswer
		status, _, err := l.call(ctx, "POST", "/v1/claim", map[string]any{
			"key": key, "fingerprint": fingerprint(key), "wait_ms": 10000,
		}, &ans, false, http.StatusOK)
		if err == nil && status == http.StatusOK {
			if ans.Outcome == "completed" && ans.Response != nil && bytes.Equal(ans.Response.Body, result(key)) {
				l.stats.op("waiter_served")
			} else {
				l.stats.anomaly("waiter_got_another_result")
			}
		}
	}()
	if pause(ctx, time.Duration(200+rand.IntN(600))*time.Millisecond) {
		l.complete(ctx, key, a.LeaseToken)
	}
	wg.Wait()
}

// abandon claims with a short lease and never finishes: the key is taken over, by this
// worker after the lease, by the abandoned-keys feed's reader, or by nobody (and then
// Redis forgets it at its expiry).
func (l *load) abandon(ctx context.Context) {
	kind := "a" // for the feed's reader
	switch rand.IntN(3) {
	case 0:
		kind = "t" // taken over here
	case 1:
		if rand.IntN(2) == 0 {
			kind = "x" // left to expire
		}
	}
	key := l.key(kind)
	a, ok := l.acquire(ctx, key, fingerprint(key), 200*time.Millisecond)
	if !ok {
		return
	}
	pointed := rand.IntN(2) == 0 && l.recoveryPoint(ctx, key, a.LeaseToken)
	l.stats.op("abandoned")
	if kind != "t" || !pause(ctx, 400*time.Millisecond) {
		return
	}
	b, ok := l.acquire(ctx, key, fingerprint(key), 10*time.Second)
	if !ok {
		return
	}
	l.tookOver(b, pointed)
	l.complete(ctx, key, b.LeaseToken)
}

// tookOver checks a claim that should have taken over an expired lease.
func (l *load) tookOver(a claimAnswer, pointed bool) {
	switch {
	case !a.Recovered:
		l.stats.anomaly("takeover_not_recovered")
	case pointed && a.RecoveryPoint == nil:
		// A recovery point acknowledged before the lease ran out must reach the next
		// holder, unless a Redis fault lost it (which the book does not count).
		l.stats.anomaly("takeover_without_recovery_point")
	default:
		l.stats.op("taken_over")
	}
}

// feed reads the abandoned-keys feed for the "a" keys and finishes each, as a
// completer does.
func (l *load) feed(ctx context.Context) {
	cursor := ""
	for page := 0; page < 10; page++ {
		q := url.Values{"prefix": {l.prefix + "a-"}, "older_than_ms": {"0"}, "limit": {"100"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var ans struct {
			Keys []struct {
				Key         string `json:"key"`
				Fingerprint string `json:"fingerprint"`
			} `json:"keys"`
			NextCursor string `json:"next_cursor"`
		}
		status, _, err := l.call(ctx, "GET", "/v1/abandoned?"+q.Encode(), nil, &ans, true, http.StatusOK)
		if err != nil || status != http.StatusOK {
			return
		}
		l.stats.op("feed_page")
		for _, k := range ans.Keys {
			if k.Fingerprint != fingerprint(k.Key) {
				l.stats.anomaly("feed_wrong_fingerprint")
			}
			var a claimAnswer
			status, _, err := l.call(ctx, "POST", "/v1/claim", map[string]any{
				"key": k.Key, "fingerprint": k.Fingerprint, "claim_secret": secret(), "lease_ms": 10000,
			}, &a, true, http.StatusCreated, http.StatusConflict, http.StatusOK)
			if err != nil || status != http.StatusCreated {
				continue
			}
			if !a.Recovered {
				l.stats.anomaly("feed_claim_not_recovered")
			}
			l.stats.op("feed_taken_over")
			l.complete(ctx, k.Key, a.LeaseToken)
		}
		if ans.NextCursor == "" {
			return
		}
		cursor = ans.NextCursor
	}
}

// purge completes a key, deletes its record and looks it up: it must be gone.
func (l *load) purge(ctx context.Context) {
	key := l.key("p")
	a, ok := l.acquire(ctx, key, fingerprint(key), 10*time.Second)
	if !ok {
		return
	}
	status, _, err := l.persist(ctx, "POST", "/v1/complete", map[string]any{
		"key": key, "lease_token": a.LeaseToken, "response": response{Status: 200},
	}, nil, http.StatusOK)
	if err != nil || status != http.StatusOK {
		return
	}
	path := "/v1/records/" + url.PathEscape(key)
	status, _, err = l.persist(ctx, "DELETE", path, nil, nil, http.StatusNoContent, http.StatusNotFound)
	if err != nil || status != http.StatusNoContent {
		return
	}
	status, _, err = l.persist(ctx, "GET", path, nil, nil, http.StatusNotFound)
	if err == nil && status == http.StatusOK {
		l.stats.anomaly("purged_record_found")
	} else if err == nil {
		l.stats.op("purged")
	}
}

// retry releases a claimed key for a retry, claims it again and completes it.
func (l *load) retry(ctx context.Context) {
	key := l.key("r")
	a, ok := l.acquire(ctx, key, fingerprint(key), 10*time.Second)
	if !ok {
		return
	}
	status, _, err := l.persist(ctx, "POST", "/v1/release", map[string]any{
		"key": key, "lease_token": a.LeaseToken, "mode": "retry",
	}, nil, http.StatusOK)
	if err != nil || status != http.StatusOK {
		return
	}
	b, ok := l.acquire(ctx, key, fingerprint(key), 10*time.Second)
	if !ok {
		return
	}
	if b.Attempt < 2 {
		l.stats.anomaly("retry_attempt_not_grown")
	}
	l.stats.op("retried")
	l.complete(ctx, key, b.LeaseToken)
}

// worker runs operations at its share of the rate until ctx ends.
func (l *load) worker(ctx context.Context, every time.Duration) {
	// Each operation, chosen at random with these weights.
	ops := []struct {
		weight int
		run    func(context.Context)
	}{
		{40, l.cycle}, {15, l.replay}, {8, l.mismatch}, {7, l.waiters},
		{10, l.abandon}, {7, l.purge}, {10, l.retry},
	}
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	// A random start spreads the workers over the first interval.
	next := time.Now().Add(time.Duration(rand.Int64N(int64(every))))
	for ctx.Err() == nil {
		if !pause(ctx, time.Until(next)) {
			return
		}
		next = next.Add(every)
		// A worker that fell behind (a fault held its calls) starts afresh rather than
		// bursting to catch up.
		if now := time.Now(); next.Before(now) {
			next = now
		}
		n := rand.IntN(total)
		for _, o := range ops {
			if n < o.weight {
				o.run(ctx)
				break
			}
			n -= o.weight
		}
	}
}
