package lintest

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// TestModelRejects makes sure the checker can fail: histories that break the state
// machine must not pass.
func TestModelRejects(t *testing.T) {
	for name, ops := range map[string][]porcupine.Operation{
		"two acquisitions": {
			{ClientId: 0, Input: input{OpClaim, "k", "a"}, Call: 0, Output: OutAcquired, Return: 10},
			{ClientId: 1, Input: input{OpClaim, "k", "b"}, Call: 20, Output: OutAcquired, Return: 30},
		},
		"complete with a superseded token": {
			{ClientId: 0, Input: input{OpClaim, "k", "a"}, Call: 0, Output: OutAcquired, Return: 10},
			{ClientId: 0, Input: input{OpRelease, "k", "a"}, Call: 20, Output: OutOK, Return: 30},
			{ClientId: 1, Input: input{OpClaim, "k", "b"}, Call: 40, Output: OutAcquired, Return: 50},
			{ClientId: 0, Input: input{OpComplete, "k", "a"}, Call: 60, Output: OutOK, Return: 70},
		},
		"a completed key acquired again": {
			{ClientId: 0, Input: input{OpClaim, "k", "a"}, Call: 0, Output: OutAcquired, Return: 10},
			{ClientId: 0, Input: input{OpComplete, "k", "a"}, Call: 20, Output: OutOK, Return: 30},
			{ClientId: 1, Input: input{OpClaim, "k", "b"}, Call: 40, Output: OutAcquired, Return: 50},
		},
	} {
		if porcupine.CheckOperations(Model, ops) {
			t.Errorf("%s: the model accepts it", name)
		}
	}
	// Concurrent calls may take effect in either order, and a call of unknown outcome
	// may or may not have happened.
	for name, ops := range map[string][]porcupine.Operation{
		"overlapping claims": {
			{ClientId: 0, Input: input{OpClaim, "k", "a"}, Call: 0, Output: OutInProgress, Return: 30},
			{ClientId: 1, Input: input{OpClaim, "k", "b"}, Call: 10, Output: OutAcquired, Return: 20},
		},
		"unknown claim that happened": {
			{ClientId: 0, Input: input{OpClaim, "k", "a"}, Call: 0, Output: OutUnknown, Return: 1 << 60},
			{ClientId: 1, Input: input{OpClaim, "k", "b"}, Call: 10, Output: OutInProgress, Return: 20},
		},
		"unknown claim that did not": {
			{ClientId: 0, Input: input{OpClaim, "k", "a"}, Call: 0, Output: OutUnknown, Return: 1 << 60},
			{ClientId: 1, Input: input{OpClaim, "k", "b"}, Call: 10, Output: OutAcquired, Return: 20},
		},
	} {
		if !porcupine.CheckOperations(Model, ops) {
			t.Errorf("%s: the model refuses it", name)
		}
	}
}

// TestFromCalls checks that calls recorded elsewhere reach the model as Run's do: an
// unknown claim without a token holds the key for nobody, a lookup finds a lost
// completion, and bad records are refused.
func TestFromCalls(t *testing.T) {
	check := func(calls ...Call) bool {
		t.Helper()
		h, err := FromCalls(calls)
		if err != nil {
			t.Fatal(err)
		}
		return porcupine.CheckOperations(Model, h.Ops)
	}
	if check(
		Call{Client: 0, Op: OpClaim, Key: "k", Token: "a", Out: OutAcquired, Start: 0, End: 10},
		Call{Client: 1, Op: OpClaim, Key: "k", Token: "b", Out: OutAcquired, Start: 20, End: 30},
	) {
		t.Error("two acquisitions of a key pass")
	}
	if check(
		Call{Client: 0, Op: OpClaim, Key: "k", Out: OutUnknown, Start: 0, End: 5},
		Call{Client: 1, Op: OpClaim, Key: "k", Token: "b", Out: OutInProgress, Start: 20, End: 30},
		Call{Client: 1, Op: OpComplete, Key: "k", Token: "b", Out: OutOK, Start: 40, End: 50},
	) {
		t.Error("a completion by a client that never held the lease passes")
	}
	if check(
		Call{Client: 0, Op: OpClaim, Key: "k", Token: "a", Out: OutAcquired, Start: 0, End: 10},
		Call{Client: 0, Op: OpComplete, Key: "k", Token: "a", Out: OutOK, Start: 20, End: 30},
		Call{Client: 1, Op: OpLookup, Key: "k", Out: OutPending, Start: 40, End: 50},
	) {
		t.Error("a completion lost after it was acknowledged passes")
	}
	if !check(
		Call{Client: 0, Op: OpClaim, Key: "k", Token: "a", Out: OutAcquired, Start: 0, End: 10},
		Call{Client: 0, Op: OpComplete, Key: "k", Token: "a", Out: OutUnknown, Start: 20, End: 30},
		Call{Client: 1, Op: OpLookup, Key: "k", Out: OutPending, Start: 40, End: 50},
		Call{Client: 1, Op: OpLookup, Key: "k", Out: OutCompleted, Start: 60, End: 70},
	) {
		t.Error("a completion of unknown outcome that landed late is refused")
	}
	if !check(
		Call{Client: 0, Op: OpClaim, Key: "k", Out: OutUnknown, Start: 0, End: 5},
		Call{Client: 1, Op: OpClaim, Key: "k", Token: "b", Out: OutInProgress, Start: 20, End: 30},
	) {
		t.Error("an unknown claim that took the key is refused")
	}
	for _, bad := range []Call{
		{Op: "extend", Key: "k", Out: OutOK},
		{Op: OpClaim, Key: "k", Out: "maybe"},
		{Op: OpClaim, Key: "k", Out: OutAcquired, Start: 10, End: 5},
	} {
		if _, err := FromCalls([]Call{bad}); err == nil {
			t.Errorf("%+v is accepted", bad)
		}
	}
}
