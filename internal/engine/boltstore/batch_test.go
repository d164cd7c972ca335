package boltstore_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
)

// TestImportBatch: a batch writes the records Import would, counts them as Import
// does, leaves a live record of the same key alone, and the file holds them all once
// a store opened without syncing is closed and opened again.
func TestImportBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idemd.db")
	s := open(t, path, boltstore.Options{NoSync: true})
	ctx := context.Background()
	now := time.Now()
	exported := func(key string, st engine.State) engine.Exported {
		e := engine.Exported{KeyDigest: engine.KeyDigest(key)}
		e.ID = engine.ID{Tenant: "team", Key: key}
		e.State, e.Attempt, e.Fingerprint = st, 1, "fp"
		e.CreatedAt, e.UpdatedAt, e.ExpiresAt = now, now, now.Add(time.Hour)
		if st == engine.StateCompleted {
			e.Response = &engine.Response{Status: 201, Body: []byte(`{"order":42}`)}
		} else {
			e.LeaseExpiresAt = now.Add(time.Minute)
		}
		return e
	}
	if _, err := s.Import(ctx, exported("held", engine.StatePending)); err != nil {
		t.Fatal(err)
	}
	batch := []engine.Exported{exported("a", engine.StateCompleted), exported("b", engine.StateCompleted),
		exported("c", engine.StatePending), exported("held", engine.StateCompleted)}
	n := 0
	for i, imp := range s.ImportBatch(ctx, batch) {
		if imp.Err != nil {
			t.Fatalf("record %d: %v", i, imp.Err)
		}
		if imp.Outcome == engine.ImportWritten {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("ImportBatch wrote %d records, want 3 (the held key kept)", n)
	}
	u, err := s.Usage(ctx, "team")
	if err != nil {
		t.Fatal(err)
	}
	if u.Records != 4 {
		t.Fatalf("usage counts %d records, want 4", u.Records)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, boltstore.Options{})
	for key, want := range map[string]engine.State{"a": engine.StateCompleted, "b": engine.StateCompleted,
		"c": engine.StatePending, "held": engine.StatePending} {
		r, err := s.Lookup(ctx, engine.ID{Tenant: "team", Key: key})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if r.State != want {
			t.Fatalf("%s is %s, want %s", key, r.State, want)
		}
	}
	if c, p := recordsGauge(t, s, "completed"), recordsGauge(t, s, "pending"); c != 2 || p != 2 {
		t.Fatalf("after reopening: %v completed, %v pending; want 2 and 2", c, p)
	}
}
