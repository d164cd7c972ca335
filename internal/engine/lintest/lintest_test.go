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
			{ClientId: 0, Input: input{opClaim, "k", "a"}, Call: 0, Output: outAcquired, Return: 10},
			{ClientId: 1, Input: input{opClaim, "k", "b"}, Call: 20, Output: outAcquired, Return: 30},
		},
		"complete with a superseded token": {
			{ClientId: 0, Input: input{opClaim, "k", "a"}, Call: 0, Output: outAcquired, Return: 10},
			{ClientId: 0, Input: input{opRelease, "k", "a"}, Call: 20, Output: outOK, Return: 30},
			{ClientId: 1, Input: input{opClaim, "k", "b"}, Call: 40, Output: outAcquired, Return: 50},
			{ClientId: 0, Input: input{opComplete, "k", "a"}, Call: 60, Output: outOK, Return: 70},
		},
		"a completed key acquired again": {
			{ClientId: 0, Input: input{opClaim, "k", "a"}, Call: 0, Output: outAcquired, Return: 10},
			{ClientId: 0, Input: input{opComplete, "k", "a"}, Call: 20, Output: outOK, Return: 30},
			{ClientId: 1, Input: input{opClaim, "k", "b"}, Call: 40, Output: outAcquired, Return: 50},
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
			{ClientId: 0, Input: input{opClaim, "k", "a"}, Call: 0, Output: outInProgress, Return: 30},
			{ClientId: 1, Input: input{opClaim, "k", "b"}, Call: 10, Output: outAcquired, Return: 20},
		},
		"unknown claim that happened": {
			{ClientId: 0, Input: input{opClaim, "k", "a"}, Call: 0, Output: outUnknown, Return: 1 << 60},
			{ClientId: 1, Input: input{opClaim, "k", "b"}, Call: 10, Output: outInProgress, Return: 20},
		},
		"unknown claim that did not": {
			{ClientId: 0, Input: input{opClaim, "k", "a"}, Call: 0, Output: outUnknown, Return: 1 << 60},
			{ClientId: 1, Input: input{opClaim, "k", "b"}, Call: 10, Output: outAcquired, Return: 20},
		},
	} {
		if !porcupine.CheckOperations(Model, ops) {
			t.Errorf("%s: the model refuses it", name)
		}
	}
}
