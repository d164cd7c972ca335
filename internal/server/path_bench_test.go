package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

// fixedEngine answers every claim acquired and every completion ok at once, so that a
// benchmark over it measures the HTTP layer alone.
type fixedEngine struct{ Engine }

func (fixedEngine) Claim(_ context.Context, r engine.ClaimRequest) (engine.ClaimResult, error) {
	now := time.Now()
	return engine.ClaimResult{Outcome: engine.OutcomeAcquired, Record: engine.Record{ID: r.ID, State: engine.StatePending,
		Attempt: 1, LeaseToken: "0123456789abcdef0123456789abcdef", LeaseExpiresAt: now.Add(r.Lease), CreatedAt: now, UpdatedAt: now,
		ExpiresAt: now.Add(time.Hour)}}, nil
}

func (fixedEngine) Complete(_ context.Context, c engine.Completion) (engine.Record, error) {
	now := time.Now()
	resp := c.Response
	return engine.Record{ID: c.ID, State: engine.StateCompleted, Fingerprint: "load", Attempt: 1, CreatedAt: now, UpdatedAt: now,
		ExpiresAt: now.Add(time.Hour), Response: &resp}, nil
}

// deadlineRecorder takes deadlines as a connection of net/http's does.
type deadlineRecorder struct{ *httptest.ResponseRecorder }

func (deadlineRecorder) SetReadDeadline(time.Time) error  { return nil }
func (deadlineRecorder) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkServeCycle runs a claim and a complete through the Server's handler, its
// middleware included, over an engine that answers at once: what the HTTP layer costs
// a cycle, without the network and the store.
// go test -run XXX -bench ServeCycle -benchmem ./internal/server/
func BenchmarkServeCycle(b *testing.B) {
	s := New(fixedEngine{}, Config{})
	claim := `{"key":"orders/42","fingerprint":"load","lease_ms":30000}`
	complete := `{"key":"orders/42","lease_token":"0123456789abcdef0123456789abcdef","response":{"status":201,"headers":{"Content-Type":["application/json"]},"body":"eyJvcmRlciI6NDJ9"}}`
	serve := func(path, body string, status int) {
		r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1"+path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := deadlineRecorder{httptest.NewRecorder()}
		s.ServeHTTP(w, r)
		if w.Code != status {
			b.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		serve("/v1/claim", claim, http.StatusCreated)
		serve("/v1/complete", complete, http.StatusOK)
	}
}
