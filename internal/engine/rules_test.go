package engine_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
)

// TestRules holds the rule functions to the table every store is held to. The holder
// acts at t0 and the rule's transition comes a second later, when a 100 ms lease has
// run out and a 30 s one has not.
func TestRules(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000).UTC()
	now := t0.Add(time.Second)
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "k"}
	for _, r := range enginetest.Rules {
		t.Run(r.Name, func(t *testing.T) {
			tokens := map[enginetest.Who]string{enginetest.Holder: "holder-token", enginetest.Other: "claimer-token"}
			var cur *engine.Entry
			for _, c := range enginetest.Setup(id, tokens[enginetest.Holder], r.Given) {
				step := apply(cur, c, t0)
				if step.Err != nil || !step.Write {
					t.Fatalf("bringing the key to its starting point: %v, write %v", step.Err, step.Write)
				}
				cur = &step.Next
			}
			c := r.Do.Call(id, tokens)
			step := apply(cur, c, now)

			changed := !reflect.DeepEqual(step.Next, entryOrZero(cur))
			if step.Write != changed {
				t.Errorf("write %v, but the record changed: %v", step.Write, changed)
			}
			var before, after *engine.Record
			if cur != nil {
				before = &cur.Record
			}
			if step.Next.State != "" {
				next := step.Next.Record
				after = &next
			}
			res, _ := step.ClaimResult()
			rec, _ := step.Result()
			r.CheckPoint(t, res, rec, step.Err, after)
			r.Check(t, tokens, res, rec, step.Err, before, after)

			// What the stores can only approximate, the rules fix to the millisecond.
			// A recovery point leaves the lease as it was.
			if step.Write && step.Next.State == engine.StatePending && c.Transition != enginetest.Mark {
				lease := map[enginetest.Transition]time.Duration{enginetest.Claim: enginetest.Lease, enginetest.Extend: enginetest.ExtendedLease}[c.Transition]
				if got := step.Next.LeaseExpiresAt; !got.Equal(now.Add(lease)) {
					t.Errorf("lease runs out at %s, want %s", got, now.Add(lease))
				}
			}
			if step.Write && step.Next.State != engine.StatePending {
				if got := step.Next.ExpiresAt; !got.Equal(now.Add(enginetest.Retention)) {
					t.Errorf("record kept until %s, want %s", got, now.Add(enginetest.Retention))
				}
			}
			var busy *engine.InProgressError
			if errors.As(step.Err, &busy) && busy.RetryAfter != enginetest.Lease-time.Second {
				t.Errorf("retry after %s, want %s", busy.RetryAfter, enginetest.Lease-time.Second)
			}
		})
	}
}

// TestExpiredRecordIsAbsent moves past a record's retention: every rule then treats it
// as absent, whether or not a store removed it.
func TestExpiredRecordIsAbsent(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000).UTC()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "k"}
	c := engine.Claim{ID: id, Lease: time.Second, Retention: time.Minute, Token: "first"}
	held := engine.ClaimStep(nil, c, t0).Next
	if want := t0.Add(time.Minute); !held.ExpiresAt.Equal(want) {
		t.Fatalf("pending record kept until %s, want %s", held.ExpiresAt, want)
	}
	atExpiry, past := held.ExpiresAt, held.ExpiresAt.Add(time.Millisecond)
	if s := engine.CompleteStep(&held, engine.Completion{ID: id, LeaseToken: "first", Retention: time.Hour}, atExpiry); s.Err != nil {
		t.Fatalf("complete at the last moment of retention: %v", s.Err)
	}
	for name, err := range map[string]error{
		"complete": engine.CompleteStep(&held, engine.Completion{ID: id, LeaseToken: "first", Retention: time.Hour}, past).Err,
		"release":  engine.ReleaseStep(&held, engine.Release{ID: id, LeaseToken: "first", Mode: engine.ReleaseRetry, Retention: time.Hour}, past).Err,
		"extend":   engine.ExtendStep(&held, engine.Extension{ID: id, LeaseToken: "first", Lease: time.Second}, past).Err,
	} {
		if !errors.Is(err, engine.ErrNotFound) {
			t.Errorf("%s past retention: %v, want not found", name, err)
		}
	}
	again := engine.ClaimStep(&held, engine.Claim{ID: id, Lease: time.Second, Retention: time.Minute, Token: "second"}, past)
	if again.Err != nil || again.Next.Attempt != 1 || again.Next.Recovered || !again.Next.CreatedAt.Equal(past) {
		t.Fatalf("claim past retention: %+v, want a fresh attempt 1", again)
	}
}

// TestPendingKeptAsLongAsItsLease claims with a lease longer than the retention, then
// extends past it: the pending record must outlive its lease.
func TestPendingKeptAsLongAsItsLease(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000).UTC()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "k"}
	held := engine.ClaimStep(nil, engine.Claim{ID: id, Lease: time.Hour, Retention: time.Minute, Token: "t"}, t0).Next
	if !held.ExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("record with a 1 h lease kept until %s, want %s", held.ExpiresAt, t0.Add(time.Hour))
	}
	ext := engine.ExtendStep(&held, engine.Extension{ID: id, LeaseToken: "t", Lease: 2 * time.Hour}, t0.Add(time.Minute)).Next
	if want := t0.Add(time.Minute + 2*time.Hour); !ext.ExpiresAt.Equal(want) || !ext.LeaseExpiresAt.Equal(want) {
		t.Fatalf("extended to %s, kept until %s; want both %s", ext.LeaseExpiresAt, ext.ExpiresAt, want)
	}
	short := engine.ExtendStep(&ext, engine.Extension{ID: id, LeaseToken: "t", Lease: time.Second}, t0.Add(2*time.Minute)).Next
	if !short.ExpiresAt.Equal(ext.ExpiresAt) {
		t.Fatalf("a shorter extension cut the record's retention from %s to %s", ext.ExpiresAt, short.ExpiresAt)
	}
}

// apply runs the rule of c's transition.
func apply(cur *engine.Entry, c enginetest.Call, now time.Time) engine.Step {
	switch c.Transition {
	case enginetest.Claim:
		return engine.ClaimStep(cur, c.Claim, now)
	case enginetest.Complete:
		return engine.CompleteStep(cur, c.Completion, now)
	case enginetest.ReleaseRetry, enginetest.ReleaseFail:
		return engine.ReleaseStep(cur, c.Release, now)
	case enginetest.Mark:
		return engine.MarkStep(cur, c.Mark, now)
	}
	return engine.ExtendStep(cur, c.Extension, now)
}

func entryOrZero(e *engine.Entry) engine.Entry {
	if e == nil {
		return engine.Entry{}
	}
	return *e
}
