package engine

import (
	"errors"
	"time"
)

// This file is the rules: every transition as a pure function of the record before it
// (nil when there is none), the request and the time, answering a Step. A store reads
// the record, calls the rule, and writes Step.Next when Step.Write is set, all as one
// atomic operation; it decides nothing itself. The Redis store cannot call Go inside
// Redis, so lua/*.lua is a second copy of these rules; enginetest.Rules is the table
// that holds this file and every store, Lua included, to the same answers.
//
// Lookup and purge need no rule: they answer ErrNotFound when the record is absent (or
// Expired), ErrStoreMoved when it is a marker (Moved), and otherwise read or delete it.

// Entry is a record as the rules see it: the Record, and the hash of its current
// lease's claim secret, which stores keep but never answer.
type Entry struct {
	Record
	Secret string
}

// Step is what one transition does to a record.
type Step struct {
	// Next is the record after the transition. Write says that it differs from the
	// record before and must be stored; a refusal never writes.
	Next  Entry
	Write bool
	// Outcome is a claim's outcome when Err is nil.
	Outcome Outcome
	// Err is the refusal: ErrNotFound, ErrLeaseLost, ErrFingerprintMismatch,
	// ErrStoreMoved, or an *InProgressError.
	Err error
}

// Expired reports whether a record kept until expiresAt is gone at now. A record past
// its retention is absent for every transition, whether or not its store has removed it.
func Expired(expiresAt, now time.Time) bool { return now.After(expiresAt) }

// Moved says whether cur is a live marker of a move to another store (or a state
// this release does not know): every transition refuses it with ErrStoreMoved and
// writes nothing, since the key is neither free nor held here. An expired marker is
// absent, as any expired record is.
func Moved(cur *Entry, now time.Time) bool {
	return cur != nil && !cur.State.Known() && !Expired(cur.ExpiresAt, now)
}

// ClaimStep decides a claim on cur at now.
func ClaimStep(cur *Entry, c Claim, now time.Time) Step {
	if Moved(cur, now) {
		return refuse(cur, ErrStoreMoved)
	}
	if cur == nil || Expired(cur.ExpiresAt, now) {
		// A key never seen, or forgotten, is acquired as attempt 1.
		return acquire(Entry{Record: Record{ID: c.ID, Fingerprint: c.Fingerprint, Attempt: 1, CreatedAt: now}}, c, now)
	}
	switch {
	case cur.State == StatePending && cur.LeaseToken == c.Token:
		// The same claim run again (a store call repeated after a lost reply) finds its
		// own token and answers as before. This comes first: it is the claim that
		// acquired, whatever else has been said since.
		return Step{Next: *cur, Outcome: OutcomeAcquired}
	case cur.Fingerprint != c.Fingerprint:
		// Fingerprints compare exactly: no fingerprint is one of its own, not a wildcard.
		return Step{Next: *cur, Err: ErrFingerprintMismatch}
	case cur.State == StateCompleted:
		return Step{Next: *cur, Outcome: OutcomeCompleted}
	case cur.State == StateFailed:
		return Step{Next: *cur, Outcome: OutcomeFailed}
	case cur.State == StatePending && cur.LeaseExpiresAt.After(now):
		if c.Secret != "" && c.Secret == cur.Secret {
			// The live lease's claim secret gets the lease back; an owner name never does.
			return Step{Next: *cur, Outcome: OutcomeAcquired}
		}
		return Step{Next: *cur, Err: &InProgressError{RetryAfter: cur.LeaseExpiresAt.Sub(now)}}
	}
	// Released for a retry, or pending under a lease that ran out: the claim takes the
	// key over as the next attempt, and the old token is dead from now on.
	next := *cur
	next.Attempt++
	next.Recovered = cur.State == StatePending
	return acquire(next, c, now)
}

// acquire gives next a new lease for c. A pending record is kept at least as long as
// its lease, and never shorter than it already was.
func acquire(next Entry, c Claim, now time.Time) Step {
	next.State, next.Owner, next.Secret, next.LeaseToken = StatePending, c.Owner, c.Secret, c.Token
	next.LeaseExpiresAt, next.UpdatedAt = now.Add(c.Lease), now
	next.ExpiresAt = later(next.ExpiresAt, now.Add(max(c.Retention, c.Lease)))
	next.Response = nil
	return Step{Next: next, Write: true, Outcome: OutcomeAcquired}
}

// held is the check every transition by lease token starts with: an absent record is
// not found, and a token that is not the record's current (or last) one has lost its
// lease. The clock does not count: a token stays good after its lease ran out until
// another claim takes the key over.
func held(cur *Entry, token string, now time.Time) error {
	switch {
	case Moved(cur, now):
		return ErrStoreMoved
	case cur == nil || Expired(cur.ExpiresAt, now):
		return ErrNotFound
	case cur.LeaseToken != token:
		return ErrLeaseLost
	}
	return nil
}

// refuse answers err and leaves cur as it is.
func refuse(cur *Entry, err error) Step {
	s := Step{Err: err}
	if cur != nil {
		s.Next = *cur
	}
	return s
}

// CompleteStep decides a completion on cur at now. Completing again with the same
// token succeeds and keeps the first result.
func CompleteStep(cur *Entry, c Completion, now time.Time) Step {
	if err := held(cur, c.LeaseToken, now); err != nil {
		return refuse(cur, err)
	}
	switch cur.State {
	case StateCompleted:
		return Step{Next: *cur}
	case StatePending:
		resp := c.Response
		return finish(cur, StateCompleted, &resp, c.Retention, now)
	}
	// Released or failed: the holder gave its lease up.
	return refuse(cur, ErrLeaseLost)
}

// ReleaseStep decides a release on cur at now. The same release repeated succeeds
// again; the other mode after it has lost the lease.
func ReleaseStep(cur *Entry, r Release, now time.Time) Step {
	if err := held(cur, r.LeaseToken, now); err != nil {
		return refuse(cur, err)
	}
	switch {
	case cur.State == StateReleased && r.Mode == ReleaseRetry, cur.State == StateFailed && r.Mode == ReleaseFail:
		return Step{Next: *cur}
	case cur.State != StatePending:
		return refuse(cur, ErrLeaseLost)
	case r.Mode == ReleaseRetry:
		return finish(cur, StateReleased, nil, r.Retention, now)
	}
	return finish(cur, StateFailed, r.Response, r.Retention, now)
}

// finish ends cur's lease in state, keeping resp (if any) for retention from now. A
// key released for a retry keeps its recovery point for the next holder; a finished
// key needs it no more.
func finish(cur *Entry, state State, resp *Response, retention time.Duration, now time.Time) Step {
	next := *cur
	next.State, next.Response = state, resp
	if state != StateReleased {
		next.RecoveryPoint = nil
	}
	next.LeaseExpiresAt, next.UpdatedAt, next.ExpiresAt = time.Time{}, now, now.Add(retention)
	return Step{Next: next, Write: true}
}

// ExtendStep decides an extension on cur at now: only a pending record's lease can be
// renewed, and the record is kept at least as long as its new lease.
func ExtendStep(cur *Entry, e Extension, now time.Time) Step {
	if err := held(cur, e.LeaseToken, now); err != nil {
		return refuse(cur, err)
	}
	if cur.State != StatePending {
		return refuse(cur, ErrLeaseLost)
	}
	next := *cur
	next.LeaseExpiresAt = now.Add(e.Lease)
	next.ExpiresAt = later(cur.ExpiresAt, next.LeaseExpiresAt)
	return Step{Next: next, Write: true}
}

// MarkStep decides a recovery point on cur at now: only the holder of a pending
// record's current token may record one, and it replaces the one before.
func MarkStep(cur *Entry, m Mark, now time.Time) Step {
	if err := held(cur, m.LeaseToken, now); err != nil {
		return refuse(cur, err)
	}
	if cur.State != StatePending {
		return refuse(cur, ErrLeaseLost)
	}
	next := *cur
	next.RecoveryPoint = &RecoveryPoint{Name: m.Name, Data: m.Data, Attempt: cur.Attempt, RecordedAt: now}
	next.UpdatedAt = now
	return Step{Next: next, Write: true}
}

// ClaimResult is the step as Store.Claim answers it.
func (s Step) ClaimResult() (ClaimResult, error) {
	if errors.Is(s.Err, ErrFingerprintMismatch) || errors.Is(s.Err, ErrStoreMoved) {
		return ClaimResult{}, s.Err
	}
	return ClaimResult{Outcome: s.Outcome, Record: s.answer()}, s.Err
}

// Result is the step as Store.Complete, Release and Extend answer it.
func (s Step) Result() (Record, error) {
	if s.Err != nil {
		return Record{}, s.Err
	}
	return s.answer(), nil
}

// answer is the record a transition answers with: it carries the stored response only
// when a claim replays it.
func (s Step) answer() Record {
	r := s.Next.Record
	if s.Outcome != OutcomeCompleted && s.Outcome != OutcomeFailed {
		r.Response = nil
	}
	return r
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
