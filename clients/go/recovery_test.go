package idem_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// The tests below check recovery points, recorded through a lease or by the low-level
// call, and the abandoned-keys feed.

// TestCheckpointReachesTheTakeover: a holder records a recovery point, and its link
// is cut; the caller that takes the key over finds the point, with what was recorded,
// in its lease. The stale holder's lease is lost, and a checkpoint through it fails
// so; completing the key drops the point.
func TestCheckpointReachesTheTakeover(t *testing.T) {
	holder, link := stalledHolder(t)
	key := freshKey("point-takeover")
	const lease = 500 * time.Millisecond
	data := []byte("ch_1\x00\xff")
	type end struct {
		lease idem.Lease
		cause error
	}
	holding := make(chan struct{})
	ended := make(chan end, 1)
	done := make(chan error, 1)
	go func() {
		_, err := holder.Do(context.Background(), key, "", func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			if l.RecoveryPoint != nil {
				return idem.Response{}, errors.New("the first lease of a key starts from a recovery point")
			}
			if err := l.Checkpoint(ctx, "charged", data); err != nil {
				return idem.Response{}, err
			}
			link.cut.Store(true)
			close(holding)
			select {
			case <-ctx.Done():
			case <-time.After(testenv.Scale(30 * time.Second)):
				return idem.Response{}, errors.New("the lease went on with its link cut")
			}
			ended <- end{l, context.Cause(ctx)}
			return idem.Response{Status: 202}, nil
		}, idem.DoOptions{Lease: lease})
		done <- err
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("the holder ended before it held the key: %v", err)
	}
	before := time.Now()
	second, _ := takeOver(t, newClient(t), key)
	if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the stale holder's Do: %v, want ErrLeaseLost", err)
	}
	e := <-ended

	p := second.RecoveryPoint
	if !second.Recovered || second.Attempt != 2 || p == nil || p.Name != "charged" || !bytes.Equal(p.Data, data) || p.Attempt != 1 ||
		p.RecordedAt.IsZero() || p.RecordedAt.After(before) {
		t.Fatalf("the takeover's lease: %+v, point %+v; want recovered attempt 2 from the point %q %q of attempt 1, recorded before the cut",
			second, p, "charged", data)
	}
	// The stale holder's lease ended by its own deadline; a checkpoint through it says
	// so, without reaching idemd.
	if err := e.lease.Checkpoint(t.Context(), "late", nil); !errors.Is(err, idem.ErrLeaseLost) || !errors.Is(err, idem.ErrLeaseExpired) {
		t.Fatalf("a checkpoint through the stale lease: %v, want ErrLeaseExpired, which matches ErrLeaseLost", err)
	}
	if !errors.Is(e.cause, idem.ErrLeaseExpired) || e.lease.Remaining() != 0 {
		t.Fatalf("the stale holder's context ended with %v, %s left", e.cause, e.lease.Remaining())
	}
	rec, err := newClient(t).Lookup(t.Context(), key)
	if err != nil || rec.State != "completed" || rec.Attempt != 2 || rec.RecoveryPoint != nil {
		t.Fatalf("the record: %+v %v, want attempt 2 completed, its recovery point dropped", rec, err)
	}
}

// TestCheckpointAnsweredLeaseLost: the key is taken from a holder whose lease is still
// live by its own reckoning (purged, and claimed again by another caller); the
// holder's next checkpoint is answered lease_lost, which ends its lease as a renewal
// answered so would: its context is cancelled, Do fails with ErrLeaseLost (not
// ErrLeaseExpired) and stores nothing, and the point is not recorded.
func TestCheckpointAnsweredLeaseLost(t *testing.T) {
	c, other := newClient(t), newClient(t)
	key := freshKey("point-lost")
	var cpErr, again, cause error
	var left time.Duration
	_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		l, _ := idem.LeaseFrom(ctx)
		if err := l.Checkpoint(ctx, "step-1", []byte("a")); err != nil {
			return idem.Response{}, err
		}
		if err := other.Purge(ctx, key); err != nil {
			return idem.Response{}, err
		}
		if cl, err := other.Claim(ctx, key, idem.ClaimOptions{Lease: 30 * time.Second}); err != nil || cl.Outcome != idem.Acquired {
			return idem.Response{}, errors.Join(errors.New("the other caller's claim"), err)
		}
		cpErr = l.Checkpoint(ctx, "step-2", []byte("b"))
		cause, left = context.Cause(ctx), l.Remaining()
		again = l.Checkpoint(context.Background(), "step-3", nil)
		return idem.Response{Status: 200}, nil
	}, idem.DoOptions{Lease: 30 * time.Second})

	if !errors.Is(cpErr, idem.ErrLeaseLost) || errors.Is(cpErr, idem.ErrLeaseExpired) {
		t.Fatalf("the checkpoint after the takeover: %v, want ErrLeaseLost from idemd's answer", cpErr)
	}
	if !errors.Is(cause, idem.ErrLeaseLost) || errors.Is(cause, idem.ErrLeaseExpired) || left != 0 {
		t.Fatalf("the work's context after it: cause %v, %s left; want cancelled with ErrLeaseLost and nothing left", cause, left)
	}
	if !errors.Is(again, idem.ErrLeaseLost) {
		t.Fatalf("a checkpoint through the lost lease: %v", again)
	}
	if !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrLeaseExpired) {
		t.Fatalf("Do: %v, want ErrLeaseLost", err)
	}
	rec, err := other.Lookup(t.Context(), key)
	if err != nil || rec.State != "pending" || rec.Attempt != 1 || rec.RecoveryPoint != nil {
		t.Fatalf("the other caller's record: %+v %v, want its pending attempt 1 without a recovery point", rec, err)
	}
}

// TestCheckpointAfterARetryRelease: a point recorded by work that failed reaches the
// next run, which a release for a retry gives the key to. A point over the daemon's
// limit is refused with 413 and changes nothing: the lease goes on and the point
// recorded before stays.
func TestCheckpointAfterARetryRelease(t *testing.T) {
	c := newClient(t)
	key := freshKey("point-retry")
	var tooLarge error
	var live bool
	var seen *idem.RecoveryPoint
	_, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		l, _ := idem.LeaseFrom(ctx)
		if err := l.Checkpoint(ctx, "reserved", []byte("rsv_9")); err != nil {
			return idem.Response{}, err
		}
		tooLarge = l.Checkpoint(ctx, "huge", bytes.Repeat([]byte{'x'}, 4097))
		live = ctx.Err() == nil && l.Remaining() > 0
		rec, err := c.Lookup(ctx, key)
		if err != nil {
			return idem.Response{}, err
		}
		seen = rec.RecoveryPoint
		return idem.Response{}, errors.New("the provider is down")
	})
	if err == nil || err.Error() != "the provider is down" {
		t.Fatalf("Do: %v, want the work's error after the key was released", err)
	}
	var p *idem.Problem
	if !errors.As(tooLarge, &p) || p.Status != http.StatusRequestEntityTooLarge || !errors.Is(tooLarge, idem.ErrPayloadTooLarge) || errors.Is(tooLarge, idem.ErrLeaseLost) {
		t.Fatalf("an oversized checkpoint: %v, want a 413 matching ErrPayloadTooLarge", tooLarge)
	}
	if !live {
		t.Fatal("the oversized checkpoint ended the lease")
	}
	if seen == nil || seen.Name != "reserved" || string(seen.Data) != "rsv_9" || seen.Attempt != 1 {
		t.Fatalf("the point looked up after the oversized one: %+v, want reserved rsv_9 of attempt 1", seen)
	}

	var next idem.Lease
	res, err := c.Do(t.Context(), key, "", func(ctx context.Context) (idem.Response, error) {
		next, _ = idem.LeaseFrom(ctx)
		return idem.Response{Status: 201}, nil
	})
	p2 := next.RecoveryPoint
	if err != nil || res.Status != 201 || next.Attempt != 2 || next.Recovered || p2 == nil || p2.Name != "reserved" || string(p2.Data) != "rsv_9" || p2.Attempt != 1 {
		t.Fatalf("the run after the release: %+v %v, lease %+v, point %+v; want attempt 2, not recovered, from reserved rsv_9", res, err, next, p2)
	}
}

// TestCheckpointFromConsumeAndMiddleware: the leases Consume and Middleware hand out
// record points too, which the next delivery or request finds.
func TestCheckpointFromConsumeAndMiddleware(t *testing.T) {
	t.Run("Consume", func(t *testing.T) {
		c := newClient(t)
		key := idem.MessageKey("payments", freshKey("offset"))
		v := c.Consume(t.Context(), key, func(ctx context.Context) error {
			l, _ := idem.LeaseFrom(ctx)
			if err := l.Checkpoint(ctx, "debited", []byte("acct-1")); err != nil {
				return err
			}
			return errors.New("the ledger timed out")
		})
		if v.Action != idem.Requeue || !v.Ran {
			t.Fatalf("the first delivery: %+v, want a requeue after the work ran", v)
		}
		var point *idem.RecoveryPoint
		v = c.Consume(t.Context(), key, func(ctx context.Context) error {
			l, _ := idem.LeaseFrom(ctx)
			point = l.RecoveryPoint
			return nil
		})
		if v.Action != idem.Ack || point == nil || point.Name != "debited" || string(point.Data) != "acct-1" {
			t.Fatalf("the redelivery: %+v, point %+v; want an ack from the point debited", v, point)
		}
	})

	t.Run("Middleware", func(t *testing.T) {
		var points []*idem.RecoveryPoint
		var cpErr error
		runs := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			l, _ := idem.LeaseFrom(r.Context())
			points = append(points, l.RecoveryPoint)
			if runs == 1 {
				cpErr = l.Checkpoint(r.Context(), "shipped", []byte("parcel-3"))
				http.Error(w, "the carrier is down", http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		url := serve(t, h)
		key := freshKey("mw-point")
		if r := (call{key: key, body: `{}`}).do(t, url); r.status != http.StatusBadGateway || cpErr != nil {
			t.Fatalf("the first request: %d, checkpoint %v", r.status, cpErr)
		}
		rec, err := newClient(t).Lookup(t.Context(), idem.MiddlewareKey("alice", key))
		if err != nil || rec.State != "released" || rec.RecoveryPoint == nil || rec.RecoveryPoint.Name != "shipped" {
			t.Fatalf("the record after the 502: %+v %v, want released with the point shipped", rec, err)
		}
		if r := (call{key: key, body: `{}`}).do(t, url); r.status != http.StatusCreated {
			t.Fatalf("the retry: %d %s", r.status, r.body)
		}
		if len(points) != 2 || points[0] != nil || points[1] == nil || points[1].Name != "shipped" || string(points[1].Data) != "parcel-3" {
			t.Fatalf("the points the two runs started from: %+v", points)
		}
	})
}

// TestRecordRecoveryPoint: the low-level call, by lease token. The next acquisition's
// claim carries the point; the token of the holder it was taken from is refused.
func TestRecordRecoveryPoint(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	key := freshKey("point-low")
	first, err := c.Claim(ctx, key, idem.ClaimOptions{Lease: 150 * time.Millisecond})
	if err != nil || first.RecoveryPoint != nil {
		t.Fatalf("the first claim: %+v %v", first, err)
	}
	if err := c.RecordRecoveryPoint(ctx, key, first.Token, "reserved", []byte{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := c.RecordRecoveryPoint(ctx, key, first.Token, "", nil); err == nil {
		t.Fatal("a recovery point without a name was recorded")
	}
	if err := c.RecordRecoveryPoint(ctx, freshKey("never-claimed"), first.Token, "x", nil); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("a point for a key never claimed: %v, want ErrNotFound", err)
	}
	var second *idem.Claim
	testenv.WaitFor(t, 30*time.Second, "the first lease to run out", func() bool {
		second, err = c.Claim(ctx, key, idem.ClaimOptions{})
		if err != nil && !errors.Is(err, idem.ErrInProgress) {
			t.Fatal(err)
		}
		return err == nil
	})
	p := second.RecoveryPoint
	if second.Outcome != idem.Acquired || !second.Recovered || second.Attempt != 2 || p == nil || p.Name != "reserved" ||
		!bytes.Equal(p.Data, []byte{0, 1, 2}) || p.Attempt != 1 {
		t.Fatalf("the takeover's claim: %+v, point %+v", second, p)
	}
	if err := c.RecordRecoveryPoint(ctx, key, first.Token, "stale", nil); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("a point under the stale token: %v, want ErrLeaseLost", err)
	}
	if err := c.RecordRecoveryPoint(ctx, key, second.Token, "cleared", nil); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Lookup(ctx, key)
	if err != nil || rec.RecoveryPoint == nil || rec.RecoveryPoint.Name != "cleared" || rec.RecoveryPoint.Data != nil || rec.RecoveryPoint.Attempt != 2 {
		t.Fatalf("the record: %+v %v, want the point cleared of attempt 2 without data", rec, err)
	}
}

// abandonedUnder reads every page of the feed under prefix, limit keys a page.
func abandonedUnder(t *testing.T, c *idem.Client, prefix string, limit int) []idem.AbandonedKey {
	t.Helper()
	var keys []idem.AbandonedKey
	opts := idem.AbandonedOptions{Prefix: prefix, Limit: limit}
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatalf("more than 1000 pages under %q", prefix)
		}
		page, err := c.Abandoned(t.Context(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && len(page.Keys) > limit {
			t.Fatalf("a page of %d keys over its limit of %d", len(page.Keys), limit)
		}
		keys = append(keys, page.Keys...)
		if page.Next == "" {
			return keys
		}
		opts.Cursor = page.Next
	}
}

// waitAbandoned waits until the feed under prefix lists exactly want.
func waitAbandoned(t *testing.T, c *idem.Client, prefix string, want ...string) []idem.AbandonedKey {
	t.Helper()
	slices.Sort(want)
	var keys []idem.AbandonedKey
	var got []string
	testenv.WaitFor(t, 30*time.Second, "the feed to list "+strings.Join(want, ", "), func() bool {
		keys = abandonedUnder(t, c, prefix, 0)
		got = got[:0]
		for _, k := range keys {
			got = append(got, k.Key)
		}
		slices.Sort(got)
		return slices.Equal(got, want)
	})
	return keys
}

// TestAbandonedFeed: keys whose holders left them show in the feed under their
// prefix, with their attempt, fingerprint, owner and recovery point; a live lease, a
// finished key and a key under another prefix do not. Pages of one key read them all,
// and so does the iterator.
func TestAbandonedFeed(t *testing.T) {
	ctx := t.Context()
	c := newClient(t, idem.WithOwner("worker-7"))
	prefix := freshKey("feed") + "/"
	claim := func(key, fingerprint string, lease time.Duration) *idem.Claim {
		cl, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: fingerprint, Lease: lease})
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("claim %s: %+v %v", key, cl, err)
		}
		return cl
	}
	a := claim(prefix+"a", "sha256:aa", 150*time.Millisecond)
	if err := c.RecordRecoveryPoint(ctx, prefix+"a", a.Token, "charged", []byte("ch_1")); err != nil {
		t.Fatal(err)
	}
	claim(prefix+"b", "", 150*time.Millisecond)
	claim(prefix+"c", "sha256:cc", 150*time.Millisecond)
	claim(prefix+"live", "", time.Minute)
	done := claim(prefix+"done", "", 150*time.Millisecond)
	if err := c.Complete(ctx, prefix+"done", done.Token, idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	claim(freshKey("elsewhere"), "", 150*time.Millisecond)

	keys := waitAbandoned(t, c, prefix, prefix+"a", prefix+"b", prefix+"c")
	slices.SortFunc(keys, func(x, y idem.AbandonedKey) int { return strings.Compare(x.Key, y.Key) })
	for i, want := range []struct{ fingerprint, point string }{{"sha256:aa", "charged"}, {"", ""}, {"sha256:cc", ""}} {
		k := keys[i]
		if k.Attempt != 1 || k.Fingerprint != want.fingerprint || k.Owner != "worker-7" || k.RecoveryPoint != want.point || k.LeaseExpiredAt.IsZero() {
			t.Errorf("abandoned %+v, want attempt 1, fingerprint %q, owner worker-7, recovery point %q", k, want.fingerprint, want.point)
		}
	}
	if paged := abandonedUnder(t, c, prefix, 1); len(paged) != 3 {
		t.Fatalf("pages of one key read %d keys, want 3: %+v", len(paged), paged)
	}
	var ranged []string
	for k, err := range c.AbandonedKeys(ctx, idem.AbandonedOptions{Prefix: prefix, Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		ranged = append(ranged, k.Key)
	}
	slices.Sort(ranged)
	if !slices.Equal(ranged, []string{prefix + "a", prefix + "b", prefix + "c"}) {
		t.Fatalf("the iterator read %q", ranged)
	}
	if page, err := c.Abandoned(ctx, idem.AbandonedOptions{Prefix: prefix, OlderThan: time.Hour}); err != nil || len(page.Keys) != 0 {
		t.Fatalf("leases that ran out over an hour ago: %+v %v, want none", page, err)
	}
	var p *idem.Problem
	if _, err := c.Abandoned(ctx, idem.AbandonedOptions{Prefix: prefix, Cursor: "!!!"}); !errors.As(err, &p) || p.Status != http.StatusBadRequest {
		t.Fatalf("a malformed cursor: %v, want a 400", err)
	}
}
