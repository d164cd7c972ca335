package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// deliver is one delivery of a message to Consume, with fn counting its runs and
// returning err.
func deliver(t *testing.T, c *idem.Client, key string, runs *int, err error) idem.Verdict {
	t.Helper()
	return c.Consume(t.Context(), key, func(ctx context.Context) error {
		*runs++
		return err
	})
}

func TestConsumeAcksHandledMessages(t *testing.T) {
	c := newClient(t)
	key := idem.StepKey(freshKey("req"), "charge")
	var runs int
	if v := deliver(t, c, key, &runs, nil); v.Action != idem.Ack || !v.Ran || v.Err != nil {
		t.Fatalf("first delivery: %+v, want an ack after running", v)
	}
	if v := deliver(t, c, key, &runs, nil); v.Action != idem.Ack || v.Ran || v.Err != nil {
		t.Fatalf("redelivery: %+v, want an ack without running", v)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times for two deliveries", runs)
	}
}

func TestConsumeRequeuesWhatAnotherConsumerHolds(t *testing.T) {
	c := newClient(t)
	key := idem.StepKey(freshKey("req"), "charge")
	if _, err := c.Claim(t.Context(), key, idem.ClaimOptions{Lease: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var runs int
	v := deliver(t, c, key, &runs, nil)
	if v.Action != idem.Requeue || v.Ran || !errors.Is(v.Err, idem.ErrInProgress) || v.Delay < 10*time.Second {
		t.Fatalf("delivery while another consumer holds the key: %+v, want a requeue after the lease's time", v)
	}
	if runs != 0 {
		t.Fatal("fn ran without the lease")
	}
}

func TestConsumeRequeuesATransientFailure(t *testing.T) {
	c := newClient(t)
	key := idem.StepKey(freshKey("req"), "charge")
	var runs int
	boom := errors.New("the database is down")
	if v := deliver(t, c, key, &runs, boom); v.Action != idem.Requeue || !v.Ran || !errors.Is(v.Err, boom) || v.Delay <= 0 {
		t.Fatalf("failed delivery: %+v, want a requeue", v)
	}
	if v := deliver(t, c, key, &runs, nil); v.Action != idem.Ack || !v.Ran {
		t.Fatalf("redelivery after the key's release: %+v, want an ack after running", v)
	}
	if runs != 2 {
		t.Fatalf("fn ran %d times, want 2", runs)
	}
}

func TestConsumeDeadLettersAPermanentFailure(t *testing.T) {
	c := newClient(t)
	key := idem.StepKey(freshKey("req"), "charge")
	var runs int
	declined := idem.Permanent(errors.New("card declined"), idem.Response{Status: 402})
	if v := deliver(t, c, key, &runs, declined); v.Action != idem.DeadLetter || !v.Ran {
		t.Fatalf("permanent failure: %+v, want a dead letter", v)
	}
	if v := deliver(t, c, key, &runs, nil); v.Action != idem.DeadLetter || v.Ran || !errors.Is(v.Err, idem.ErrFailed) {
		t.Fatalf("redelivery of a failed message: %+v, want a dead letter without running", v)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1", runs)
	}
}

func TestConsumeNeverRunsWithoutIdemd(t *testing.T) {
	d := ownDaemon(t)
	c, err := idem.New(d.URL, idem.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	d.Kill()
	var runs int
	v := deliver(t, c, idem.StepKey(freshKey("req"), "charge"), &runs, nil)
	if v.Action != idem.Requeue || v.Ran || !errors.Is(v.Err, idem.ErrUnavailable) || runs != 0 {
		t.Fatalf("delivery with idemd down: %+v after %d runs, want a requeue without running", v, runs)
	}
}

func TestConsumeRequeuesAnUnstoredOutcome(t *testing.T) {
	c, link := stalledHolder(t)
	key := idem.StepKey(freshKey("req"), "charge")
	v := c.Consume(t.Context(), key, func(ctx context.Context) error {
		link.cut.Store(true) // the work is done, but its outcome cannot be stored
		return nil
	})
	if v.Action != idem.Requeue || !v.Ran || v.Err == nil {
		t.Fatalf("delivery whose outcome was not stored: %+v, want a requeue", v)
	}
}

// TestConsumeRequeuesWhenTheLeaseRunsOut: the consumer's link to idemd is cut while
// its work runs; the lease's deadline passes, the work's context ends, and the message
// is requeued, even though the work, which went on, reports success.
func TestConsumeRequeuesWhenTheLeaseRunsOut(t *testing.T) {
	c, link := stalledHolder(t)
	key := idem.StepKey(freshKey("req"), "charge")
	var cause error
	v := c.Consume(t.Context(), key, func(ctx context.Context) error {
		link.cut.Store(true)
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(testenv.Scale(30 * time.Second)):
			return errors.New("the lease went on with its link cut")
		}
		return nil
	}, idem.DoOptions{Lease: 300 * time.Millisecond})
	if v.Action != idem.Requeue || !v.Ran || !errors.Is(v.Err, idem.ErrLeaseExpired) || !errors.Is(cause, idem.ErrLeaseExpired) {
		t.Fatalf("delivery whose lease ran out: %+v (the work's context ended with %v), want a requeue for ErrLeaseExpired", v, cause)
	}
}

func TestConsumeHandsTheLease(t *testing.T) {
	c := newClient(t)
	key := idem.StepKey(freshKey("req"), "charge")
	var got idem.Lease
	var ok bool
	v := c.Consume(t.Context(), key, func(ctx context.Context) error {
		got, ok = idem.LeaseFrom(ctx)
		return nil
	})
	if v.Action != idem.Ack || !ok || got.Key != key || got.Attempt != 1 || got.Recovered {
		t.Fatalf("verdict %+v, lease %+v (found %v), want the first lease on %q", v, got, ok, key)
	}
}

func TestStepKey(t *testing.T) {
	k := freshKey("req")
	if idem.StepKey(k, "charge") != idem.StepKey(k, "charge") {
		t.Fatal("StepKey is not stable")
	}
	if idem.StepKey(k, "charge") == idem.StepKey(k, "email") || idem.StepKey(k, "charge") == idem.StepKey(k+"x", "charge") {
		t.Fatal("StepKey gives two steps the same key")
	}
	// The same key in every idemd client.
	if got := idem.StepKey("req-1", "charge"); got != "msg-828aedf1c68eb588f35320345076e88dc90193e8a33ddf7b632f66ea0d1e46e8" {
		t.Fatalf("StepKey(req-1, charge) = %s", got)
	}
	if idem.StepKey("a", "bc") == idem.StepKey("ab", "c") {
		t.Fatal("StepKey does not separate its parts")
	}
}
