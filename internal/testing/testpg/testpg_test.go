package testpg_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/testing/testpg"
)

// TestServer: the server answers queries, and is gone once stopped (Stop may be
// called again, as New's cleanup does).
func TestServer(t *testing.T) {
	s := testpg.New(t)
	conn, err := pgx.Connect(t.Context(), s.URL)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT 40 + 2").Scan(&n); err != nil || n != 42 {
		t.Fatalf("SELECT 40 + 2: %d %v", n, err)
	}
	conn.Close(t.Context())
	s.Stop()
	if c, err := pgx.Connect(t.Context(), s.URL); err == nil {
		c.Close(t.Context())
		t.Fatal("the server still answers after Stop")
	}
}
