package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

// deadlineStore fails every claim with a deadline error of its own, as the Redis
// store does when calls that share a pipeline run to the latest of their deadlines
// and that passes just before the caller's own store deadline is marked done.
type deadlineStore struct{ *memStore }

func (deadlineStore) Claim(context.Context, engine.Claim) (engine.ClaimResult, error) {
	return engine.ClaimResult{}, engine.Unavailable(context.DeadlineExceeded)
}

// TestStoreDeadlineIsAStoreTimeout: a store's own deadline error, while the caller is
// still there, is the store's timeout (503 with Retry-After), never the caller's
// (which the HTTP layer answers as a caller that went away).
func TestStoreDeadlineIsAStoreTimeout(t *testing.T) {
	svc := engine.NewService(deadlineStore{newMemStore()}, time.Hour, engine.WithStoreTimeout(time.Minute))
	_, err := svc.Claim(t.Context(), engine.ClaimRequest{ID: waitKey})
	var timeout *engine.StoreTimeoutError
	if !errors.As(err, &timeout) || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("claim: %v, want a *StoreTimeoutError", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("claim: %v unwraps to a context error, which the HTTP layer takes for the caller's", err)
	}
}
