package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/idemd/idemd/internal/engine"
)

// TestStoreTimeoutsAreUnavailable: a store that could not answer is 503
// store_unavailable, even when what cut it off was an I/O deadline of its own
// connection; only the caller's leaving, or an answer it did not read, is 499.
func TestStoreTimeoutsAreUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
	}{
		{"the store's connection timed out", engine.Unavailable(fmt.Errorf("read tcp: %w", os.ErrDeadlineExceeded)), http.StatusServiceUnavailable},
		{"the caller went away", context.Canceled, statusClientClosed},
		{"the caller did not read its answer", fmt.Errorf("write tcp: %w", os.ErrDeadlineExceeded), statusClientClosed},
	} {
		if p := toProblem(tc.err); p.status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, p.status, p.code, tc.status)
		}
	}
}
