package enginetest

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

// Rules is the table of idemd's transitions. Each rule starts from a record that one
// holder brought somewhere (Given), tries one transition (Do), and says what must come
// of it (Want). The engine's own test holds the rules in internal/engine/rules.go to it,
// and RunRules holds a store to it, so a store that runs the rules elsewhere (Redis runs
// lua/*.lua) answers exactly as they do.
var Rules = []Rule{
	{"claim on an absent key acquires attempt 1", Absent, Do{Claim, Other, None, "fp"},
		Want{Outcome: engine.OutcomeAcquired, State: engine.StatePending, Attempt: 1, Token: Other}},
	{"complete on an absent key is not found", Absent, Do{Complete, Other, None, ""}, Want{Err: engine.ErrNotFound}},
	{"release on an absent key is not found", Absent, Do{ReleaseRetry, Other, None, ""}, Want{Err: engine.ErrNotFound}},
	{"release as failed on an absent key is not found", Absent, Do{ReleaseFail, Other, None, ""}, Want{Err: engine.ErrNotFound}},
	{"extend on an absent key is not found", Absent, Do{Extend, Other, None, ""}, Want{Err: engine.ErrNotFound}},
	{"a recovery point on an absent key is not found", Absent, Do{Mark, Other, None, ""}, Want{Err: engine.ErrNotFound}},

	{"a claim resent with the holder's token acquires again, unchanged", Held, Do{Claim, Holder, Holder, "fp"},
		Want{Outcome: engine.OutcomeAcquired, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"a claim with the live lease's secret gets the lease back", Held, Do{Claim, Other, Holder, "fp"},
		Want{Outcome: engine.OutcomeAcquired, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"a claim with another secret is in progress", Held, Do{Claim, Other, Other, "fp"},
		Want{Err: engine.ErrInProgress, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"a claim with no secret is in progress", Held, Do{Claim, Other, None, "fp"},
		Want{Err: engine.ErrInProgress, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"a claim with another fingerprint on a held key is a mismatch", Held, Do{Claim, Other, None, "other"},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"a claim with no fingerprint on a fingerprinted key is a mismatch", Held, Do{Claim, Other, None, ""},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the lease's secret with another fingerprint is still a mismatch", Held, Do{Claim, Other, Holder, "other"},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the holder completes", Held, Do{Complete, Holder, None, ""},
		Want{State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "second result"}},
	{"complete with another token is lease lost", Held, Do{Complete, Other, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the holder releases for a retry", Held, Do{ReleaseRetry, Holder, None, ""},
		Want{State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"the holder releases as failed", Held, Do{ReleaseFail, Holder, None, ""},
		Want{State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "second failure"}},
	{"release with another token is lease lost", Held, Do{ReleaseFail, Other, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the holder extends its lease", Held, Do{Extend, Holder, None, ""},
		Want{State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"extend with another token is lease lost", Held, Do{Extend, Other, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the holder records a recovery point over its last one", Held, Do{Mark, Holder, None, ""},
		Want{State: engine.StatePending, Attempt: 1, Token: Holder, Point: SecondPoint}},
	{"a recovery point with another token is lease lost", Held, Do{Mark, Other, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StatePending, Attempt: 1, Token: Holder}},

	{"a claim takes over a lease that ran out, as a recovered attempt 2", LeaseRanOut, Do{Claim, Other, None, "fp"},
		Want{Outcome: engine.OutcomeAcquired, State: engine.StatePending, Attempt: 2, Token: Other, Recovered: true}},
	{"the secret of a lease that ran out takes over as a new attempt", LeaseRanOut, Do{Claim, Other, Holder, "fp"},
		Want{Outcome: engine.OutcomeAcquired, State: engine.StatePending, Attempt: 2, Token: Other, Recovered: true}},
	{"a claim with another fingerprint after the lease ran out is a mismatch", LeaseRanOut, Do{Claim, Other, None, "other"},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the holder still completes after its lease ran out, while nobody took over", LeaseRanOut, Do{Complete, Holder, None, ""},
		Want{State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "second result"}},
	{"the holder still extends after its lease ran out, while nobody took over", LeaseRanOut, Do{Extend, Holder, None, ""},
		Want{State: engine.StatePending, Attempt: 1, Token: Holder}},
	{"the holder still releases after its lease ran out, while nobody took over", LeaseRanOut, Do{ReleaseRetry, Holder, None, ""},
		Want{State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"the holder still records a recovery point after its lease ran out, while nobody took over", LeaseRanOut, Do{Mark, Holder, None, ""},
		Want{State: engine.StatePending, Attempt: 1, Token: Holder, Point: SecondPoint}},

	{"a claim after a retry release acquires attempt 2, not recovered", Released, Do{Claim, Other, None, "fp"},
		Want{Outcome: engine.OutcomeAcquired, State: engine.StatePending, Attempt: 2, Token: Other}},
	{"a claim with another fingerprint after a release is a mismatch", Released, Do{Claim, Other, None, "other"},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"a repeated retry release succeeds again", Released, Do{ReleaseRetry, Holder, None, ""},
		Want{State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"release as failed after a retry release is lease lost", Released, Do{ReleaseFail, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"complete after a release is lease lost", Released, Do{Complete, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"extend after a release is lease lost", Released, Do{Extend, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateReleased, Attempt: 1, Token: Holder}},
	{"a recovery point after a release is lease lost", Released, Do{Mark, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateReleased, Attempt: 1, Token: Holder}},

	{"a claim on a completed key replays its response", Completed, Do{Claim, Other, None, "fp"},
		Want{Outcome: engine.OutcomeCompleted, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result", Replays: true}},
	{"a claim with the holder's secret on a completed key replays too", Completed, Do{Claim, Other, Holder, "fp"},
		Want{Outcome: engine.OutcomeCompleted, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result", Replays: true}},
	{"a claim with another fingerprint on a completed key is a mismatch", Completed, Do{Claim, Other, None, "other"},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result"}},
	{"a repeated complete succeeds and keeps the first result", Completed, Do{Complete, Holder, None, ""},
		Want{State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result"}},
	{"complete with another token on a completed key is lease lost", Completed, Do{Complete, Other, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result"}},
	{"release after complete is lease lost", Completed, Do{ReleaseRetry, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result"}},
	{"extend after complete is lease lost", Completed, Do{Extend, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result"}},
	{"a recovery point after complete is lease lost", Completed, Do{Mark, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateCompleted, Attempt: 1, Token: Holder, Response: "first result"}},

	{"a claim on a failed key replays the failure", Failed, Do{Claim, Other, None, "fp"},
		Want{Outcome: engine.OutcomeFailed, State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "first failure", Replays: true}},
	{"a claim with another fingerprint on a failed key is a mismatch", Failed, Do{Claim, Other, None, "other"},
		Want{Err: engine.ErrFingerprintMismatch, State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "first failure"}},
	{"a repeated release as failed succeeds and keeps the first failure", Failed, Do{ReleaseFail, Holder, None, ""},
		Want{State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "first failure"}},
	{"a retry release after a failure is lease lost", Failed, Do{ReleaseRetry, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "first failure"}},
	{"complete after a failure is lease lost", Failed, Do{Complete, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "first failure"}},
	{"a recovery point after a failure is lease lost", Failed, Do{Mark, Holder, None, ""},
		Want{Err: engine.ErrLeaseLost, State: engine.StateFailed, Attempt: 1, Token: Holder, Response: "first failure"}},
}

// Rule is one row of the table.
type Rule struct {
	Name  string
	Given Given
	Do    Do
	Want  Want
}

// Given is where the holder left the key before the rule's transition. The holder
// claimed with fingerprint "fp", owner "holder", its own claim secret and a 30 s lease
// (100 ms for LeaseRanOut), keeping records for an hour, and recorded the recovery point
// HolderPoint before it released or completed.
type Given int

// The starting points.
const (
	Absent      Given = iota // nobody claimed the key
	Held                     // the holder's lease is live
	LeaseRanOut              // the holder's lease ran out and nobody took the key over
	Released                 // the holder released for a retry
	Completed                // the holder completed with the response "first result"
	Failed                   // the holder released as failed with "first failure"
)

// Transition names what a rule tries.
type Transition int

// The transitions. A complete sends the response "second result"; a release as failed
// sends "second failure"; a recovery point is SecondPoint.
const (
	Claim Transition = iota
	Complete
	ReleaseRetry
	ReleaseFail
	Extend
	Mark
)

// Who says whose lease token or claim secret a transition carries: the holder's, a new
// one of a second caller (the claimer), or none.
type Who int

// The parties.
const (
	None Who = iota
	Holder
	Other
)

// Do is the transition of a rule. Secret and Fingerprint matter to claims only.
type Do struct {
	Transition  Transition
	Token       Who
	Secret      Who
	Fingerprint string
}

// Want is what must come of a rule: the error (matched with errors.Is), a claim's
// outcome, and the record afterwards. Token says whose lease the record carries after;
// its owner label is that party's. Response names the stored response's body, "" for
// none; Replays says that the claim's answer carries it. Point names the recovery point
// the record keeps after; "" means HolderPoint while the key is pending or released
// (a point outlives a lease, for the next holder), and none once it is finished. A
// refused transition must leave the record exactly as it was, and every answer that is
// not a replay carries no response.
type Want struct {
	Err       error
	Outcome   engine.Outcome
	State     engine.State
	Attempt   int64
	Token     Who
	Recovered bool
	Response  string
	Replays   bool
	Point     string
}

// The parties' owner labels, and the leases and retention of the table: claims take
// Lease (the holder ShortLease for LeaseRanOut), an extension asks for ExtendedLease,
// and every transition keeps its record for Retention.
const (
	HolderOwner   = "holder"
	ClaimerOwner  = "claimer"
	Lease         = 30 * time.Second
	ShortLease    = 100 * time.Millisecond
	ExtendedLease = time.Minute
	Retention     = time.Hour
)

// The recovery points of the table, by name: the holder records HolderPoint after its
// claim, and a rule's transition records SecondPoint.
const (
	HolderPoint = "charged"
	SecondPoint = "published"
)

// Points are the recovery points' data, by name: binary, as a payload may be.
var Points = map[string][]byte{
	HolderPoint: []byte("\x00\xffch_1"),
	SecondPoint: []byte("msg-2\r\n"),
}

// Secrets are the claim secrets (as hashes) of the parties.
var Secrets = map[Who]string{
	Holder: engine.HashSecret("the holder's claim secret, 0001"),
	Other:  engine.HashSecret("the claimer's claim secret, 002"),
}

// Responses are the responses of the table, by body.
var Responses = map[string]engine.Response{
	"first result":   tableResponse(201, "first result"),
	"second result":  tableResponse(200, "second result"),
	"first failure":  tableResponse(402, "first failure"),
	"second failure": tableResponse(409, "second failure"),
}

func tableResponse(status int, body string) engine.Response {
	return engine.Response{
		Status:  status,
		Headers: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body:    append([]byte("\x00\xff\r\n"), body...),
	}
}

// Call is one transition with its request: the field its Transition names is set.
type Call struct {
	Transition Transition
	Claim      engine.Claim
	Completion engine.Completion
	Release    engine.Release
	Extension  engine.Extension
	Mark       engine.Mark
}

// Setup is what the holder does to bring the key id to given, with its lease token:
// a claim, then perhaps a release or a completion. The holder's lease is 100 ms for
// LeaseRanOut, which is reached once that has passed.
func Setup(id engine.ID, holderToken string, given Given) []Call {
	if given == Absent {
		return nil
	}
	claim := engine.Claim{ID: id, Fingerprint: "fp", Owner: HolderOwner, Secret: Secrets[Holder], Lease: Lease, Retention: Retention, Token: holderToken}
	if given == LeaseRanOut {
		claim.Lease = ShortLease
	}
	calls := []Call{{Transition: Claim, Claim: claim},
		{Transition: Mark, Mark: engine.Mark{ID: id, LeaseToken: holderToken, Name: HolderPoint, Data: Points[HolderPoint]}}}
	switch given {
	case Released:
		calls = append(calls, Call{Transition: ReleaseRetry, Release: engine.Release{ID: id, LeaseToken: holderToken, Mode: engine.ReleaseRetry, Retention: Retention}})
	case Failed:
		resp := Responses["first failure"]
		calls = append(calls, Call{Transition: ReleaseFail, Release: engine.Release{ID: id, LeaseToken: holderToken, Mode: engine.ReleaseFail, Response: &resp, Retention: Retention}})
	case Completed:
		calls = append(calls, Call{Transition: Complete, Completion: engine.Completion{ID: id, LeaseToken: holderToken, Response: Responses["first result"], Retention: Retention}})
	}
	return calls
}

// Call is the rule's transition on id; tokens holds each party's lease token.
func (d Do) Call(id engine.ID, tokens map[Who]string) Call {
	tok := tokens[d.Token]
	switch d.Transition {
	case Claim:
		owner := ClaimerOwner
		if d.Token == Holder {
			owner = HolderOwner
		}
		return Call{Transition: Claim, Claim: engine.Claim{ID: id, Fingerprint: d.Fingerprint, Owner: owner,
			Secret: Secrets[d.Secret], Lease: Lease, Retention: Retention, Token: tok}}
	case Complete:
		return Call{Transition: Complete, Completion: engine.Completion{ID: id, LeaseToken: tok, Response: Responses["second result"], Retention: Retention}}
	case ReleaseRetry:
		return Call{Transition: ReleaseRetry, Release: engine.Release{ID: id, LeaseToken: tok, Mode: engine.ReleaseRetry, Retention: Retention}}
	case ReleaseFail:
		resp := Responses["second failure"]
		return Call{Transition: ReleaseFail, Release: engine.Release{ID: id, LeaseToken: tok, Mode: engine.ReleaseFail, Response: &resp, Retention: Retention}}
	case Mark:
		return Call{Transition: Mark, Mark: engine.Mark{ID: id, LeaseToken: tok, Name: SecondPoint, Data: Points[SecondPoint]}}
	}
	return Call{Transition: Extend, Extension: engine.Extension{ID: id, LeaseToken: tok, Lease: ExtendedLease}}
}

// On makes the call on s: res is a claim's answer, rec the others'.
func (c Call) On(ctx context.Context, s engine.Store) (res engine.ClaimResult, rec engine.Record, err error) {
	switch c.Transition {
	case Claim:
		res, err = s.Claim(ctx, c.Claim)
	case Complete:
		rec, err = s.Complete(ctx, c.Completion)
	case ReleaseRetry, ReleaseFail:
		rec, err = s.Release(ctx, c.Release)
	case Extend:
		rec, err = s.Extend(ctx, c.Extension)
	case Mark:
		rec, err = s.Mark(ctx, c.Mark)
	}
	return res, rec, err
}

// Check compares what a rule's transition answered (res for claims, rec for the
// others, and err), and the record before and after it (nil when absent), with the
// rule. It reports mismatches through t.
func (r Rule) Check(t testing.TB, tokens map[Who]string, res engine.ClaimResult, rec engine.Record, err error, before, after *engine.Record) {
	t.Helper()
	w := r.Want
	if w.Err == nil && err != nil || w.Err != nil && !errors.Is(err, w.Err) {
		t.Fatalf("answered %v, want %v", err, w.Err)
	}
	answer := rec
	if r.Do.Transition == Claim {
		answer = res.Record
		if res.Outcome != w.Outcome {
			t.Errorf("outcome %q, want %q", res.Outcome, w.Outcome)
		}
	}
	if w.State == "" {
		if after != nil {
			t.Fatalf("the record exists after the transition: %+v", *after)
		}
		return
	}
	if after == nil {
		t.Fatalf("no record after the transition, want one %s", w.State)
	}
	owner := HolderOwner
	if w.Token == Other {
		owner = ClaimerOwner
	}
	if after.State != w.State || after.Attempt != w.Attempt || after.LeaseToken != tokens[w.Token] ||
		after.Owner != owner || after.Recovered != w.Recovered || after.Fingerprint != "fp" {
		t.Errorf("record after: state %s attempt %d token %q owner %q recovered %v fingerprint %q; want %s %d %q %q %v \"fp\"",
			after.State, after.Attempt, after.LeaseToken, after.Owner, after.Recovered, after.Fingerprint,
			w.State, w.Attempt, tokens[w.Token], owner, w.Recovered)
	}
	if w.Response == "" {
		if after.Response != nil {
			t.Errorf("record after keeps a response %+v, want none", *after.Response)
		}
	} else if want := Responses[w.Response]; !sameResponse(after.Response, &want) {
		t.Errorf("record after keeps response %+v, want %q", after.Response, w.Response)
	}
	if after.State == engine.StatePending {
		if after.LeaseExpiresAt.IsZero() || after.ExpiresAt.Before(after.LeaseExpiresAt) {
			t.Errorf("pending record with lease until %s is kept until %s", after.LeaseExpiresAt, after.ExpiresAt)
		}
	} else if !after.LeaseExpiresAt.IsZero() {
		t.Errorf("%s record shows a lease until %s", after.State, after.LeaseExpiresAt)
	}
	if w.Err != nil && !reflect.DeepEqual(withoutPoint(before), withoutPoint(after)) {
		t.Errorf("a refused transition changed the record:\nbefore %+v\nafter  %+v", before, after)
	}
	if errors.Is(w.Err, engine.ErrInProgress) {
		var busy *engine.InProgressError
		if !errors.As(err, &busy) || busy.RetryAfter <= 0 || busy.RetryAfter > Lease {
			t.Errorf("in progress %v, want a retry-after within the holder's %s lease", err, Lease)
		}
	}
	if w.Err != nil {
		return
	}
	if w.Replays {
		if !sameResponse(answer.Response, after.Response) {
			t.Errorf("the answer replays %+v, want the stored response", answer.Response)
		}
	} else if answer.Response != nil {
		t.Errorf("the answer carries a response %+v; only a replay does", *answer.Response)
	}
	// CheckPoint compares the recovery points.
	answer.Response, answer.RecoveryPoint = nil, nil
	rest := *after
	rest.Response, rest.RecoveryPoint = nil, nil
	if !reflect.DeepEqual(answer, rest) {
		t.Errorf("the answer is not the record after the transition:\nanswer %+v\nafter  %+v", answer, *after)
	}
}

// CheckPoint compares the recovery point the record keeps after the transition with the
// rule's, and with the one the transition answered (res for claims, rec for the others).
// Every point of the table is the holder's, made at attempt 1.
func (r Rule) CheckPoint(t testing.TB, res engine.ClaimResult, rec engine.Record, err error, after *engine.Record) {
	t.Helper()
	if after == nil {
		return
	}
	answer := rec
	if r.Do.Transition == Claim {
		answer = res.Record
	}
	if err == nil && !reflect.DeepEqual(answer.RecoveryPoint, after.RecoveryPoint) {
		t.Errorf("the answer carries the recovery point %+v, the record %+v", answer.RecoveryPoint, after.RecoveryPoint)
	}
	want := r.Want.Point
	if want == "" && r.Given != Absent && (after.State == engine.StatePending || after.State == engine.StateReleased) {
		want = HolderPoint
	}
	got := after.RecoveryPoint
	switch {
	case want == "" && got != nil:
		t.Errorf("the %s record keeps the recovery point %+v, want none", after.State, *got)
	case want == "":
	case got == nil:
		t.Errorf("the record keeps no recovery point, want %q", want)
	case got.Name != want || !bytes.Equal(got.Data, Points[want]) || got.Attempt != 1 || got.RecordedAt.IsZero():
		t.Errorf("the record keeps the recovery point %+v, want %q with %q, recorded by attempt 1", *got, want, Points[want])
	}
}

// withoutPoint is rec without its recovery point, which CheckPoint compares.
func withoutPoint(rec *engine.Record) *engine.Record {
	if rec == nil {
		return nil
	}
	r := *rec
	r.RecoveryPoint = nil
	return &r
}

func sameResponse(a, b *engine.Response) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) && maps.EqualFunc(a.Headers, b.Headers, slices.Equal)
}

// Mixed is a store whose calls go in part to daemons of a release before recovery
// points and the abandoned-keys feed, sharing a Redis with this release's: they
// rewrite records without recovery points and leave the feed's index as it was.
// RunRules skips the rules' recovery points on such a store, and Run the feed.
type Mixed interface {
	WithEarlierRelease() bool
}

func mixed(s engine.Store) bool {
	m, ok := s.(Mixed)
	return ok && m.WithEarlierRelease()
}

// RunRules holds a store to the table: for each rule it brings a fresh key to the
// rule's starting point through s, does the rule's transition, and checks the answer
// and the record as Lookup shows it before and after. The rules run in parallel.
func RunRules(t *testing.T, s engine.Store) {
	points := !mixed(s)
	for _, r := range Rules {
		t.Run(r.Name, func(t *testing.T) {
			t.Parallel()
			id := newID()
			tokens := map[Who]string{Holder: engine.NewLeaseToken(), Other: engine.NewLeaseToken()}
			for _, c := range Setup(id, tokens[Holder], r.Given) {
				res, _, err := c.On(ctx(t), s)
				if err != nil {
					t.Fatalf("bringing the key to its starting point: %v", err)
				}
				if r.Given == LeaseRanOut {
					// Both stores count in whole milliseconds; a few more cover the rounding.
					wait.For(t, 10*time.Second, "the holder's lease to run out", func() bool {
						return time.Now().After(res.Record.LeaseExpiresAt.Add(5 * time.Millisecond))
					})
				}
			}
			before := lookup(t, s, id)
			res, rec, err := r.Do.Call(id, tokens).On(ctx(t), s)
			after := lookup(t, s, id)
			if points {
				r.CheckPoint(t, res, rec, err, after)
			}
			r.Check(t, tokens, res, rec, err, before, after)
		})
	}
}

// lookup returns the record of id, or nil when there is none.
func lookup(t *testing.T, s engine.Store, id engine.ID) *engine.Record {
	t.Helper()
	rec, err := s.Lookup(ctx(t), id)
	if errors.Is(err, engine.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("lookup: %v", err)
	}
	return &rec
}
