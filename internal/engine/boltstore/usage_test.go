package boltstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
)

// TestUsageSurvivesReopen: the counts a store keeps in memory are what it reads from
// its records when it opens again.
func TestUsageSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idemd.db")
	s := open(t, path, boltstore.Options{})
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		id := engine.ID{Tenant: "team", Key: key}
		c := engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
			Response: engine.Response{Status: 200, Body: []byte(strings.Repeat("x", 1000))}}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := s.Usage(ctx, "team")
	if err != nil {
		t.Fatal(err)
	}
	if before.Records != 3 || before.Bytes < 3000 {
		t.Fatalf("usage %+v, want 3 records of over 3000 bytes", before)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, boltstore.Options{})
	after, err := s.Usage(ctx, "team")
	if err != nil {
		t.Fatal(err)
	}
	if after.Records != before.Records || after.Bytes != before.Bytes {
		t.Fatalf("after reopening: %+v, want %+v", after, before)
	}
}

// TestFill measures the database against MaxSize, or against its disk without one.
func TestFill(t *testing.T) {
	dir := t.TempDir()
	sized := open(t, filepath.Join(dir, "sized.db"), boltstore.Options{MaxSize: 1 << 20})
	f, err := sized.Fill(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f.Limit != 1<<20 || f.Used <= 0 || f.Ratio() <= 0 {
		t.Fatalf("fill %+v, want some of 1 MiB", f)
	}
	disk := open(t, filepath.Join(dir, "disk.db"), boltstore.Options{})
	if f, err = disk.Fill(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.Limit <= f.Used || f.Used <= 0 {
		t.Fatalf("fill %+v against the disk, want a limit over what is used", f)
	}
}

// TestFillWhileClosing: the store guard reads the fill in the background, so a read
// may run while the daemon closes the store; it answers an error after the close and
// races with nothing (go test -race).
func TestFillWhileClosing(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if f, err := s.Fill(ctx); err != nil || f.Limit <= 0 {
		t.Fatalf("fill of an open store: %+v %v", f, err)
	}
	reading := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100000; i++ {
			if i == 1 {
				close(reading)
			}
			if _, err := s.Fill(ctx); err != nil {
				return
			}
		}
	}()
	<-reading
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if f, err := s.Fill(ctx); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("fill of a closed store: %+v %v, want unavailable", f, err)
	}
}
