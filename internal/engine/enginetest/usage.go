package enginetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

const usageTest = "usage follows records in and out: claim, complete, release, purge, expiry"

// testUsage holds a store's count of what a tenant keeps to its records: it grows with
// each record and with what a record holds, another tenant's records do not count, and
// it falls back to nothing, exactly, as records are purged and expire.
func testUsage(t *testing.T, s engine.Store) {
	reader, ok := s.(engine.UsageReader)
	if !ok {
		t.Skip("the store counts no usage")
	}
	tenant := fmt.Sprintf("usage-%d-%d", time.Now().UnixNano()%1e6, seq.Add(1))
	usage := func() engine.Usage {
		t.Helper()
		u, err := reader.Usage(ctx(t), tenant)
		if err != nil {
			t.Fatalf("usage: %v", err)
		}
		return u
	}
	if u := usage(); u.Records != 0 || u.Bytes != 0 {
		t.Fatalf("a tenant that stored nothing uses %+v", u)
	}
	id := func(key string) engine.ID { return engine.ID{Tenant: tenant, Key: key} }

	a := claim(id("a"))
	mustAcquire(t, s, a)
	pending := usage()
	if pending.Records != 1 || pending.Bytes <= int64(len("a")) {
		t.Fatalf("after one claim: %+v, want 1 record of some bytes", pending)
	}
	// Another tenant's records are its own.
	mustAcquire(t, s, claim(newID()))
	if u := usage(); u.Records != 1 {
		t.Fatalf("another tenant's claim moved this one's usage to %+v", u)
	}

	body := strings.Repeat("x", 10_000)
	complete(t, s, a.ID, a.Token, response(body))
	done := usage()
	if done.Records != 1 || done.Bytes < pending.Bytes+int64(len(body)) {
		t.Fatalf("after completing with %d bytes: %+v, want 1 record of over %d bytes", len(body), done, pending.Bytes+int64(len(body)))
	}
	if done.NextDrop.IsZero() {
		t.Fatalf("usage %+v does not say when it will fall", done)
	}

	// A result kept in the blob store counts at the size its reference names, and
	// leaves with its record.
	ref := engine.BlobRef{Name: "00000000000/blob", Size: 5_000_000, SHA256: strings.Repeat("ab", 32)}
	for _, headers := range []map[string][]string{
		{engine.BlobHeader: {ref.String()}},
		{engine.BlobHeader: {ref.String()}, "Content-Type": {"application/octet-stream"}, "X-Other": {"Idemd-Blob:x 9 y"}},
	} {
		d := claim(id("d"))
		mustAcquire(t, s, d)
		complete(t, s, d.ID, d.Token, engine.Response{Status: 200, Headers: headers})
		if u := usage(); u.Records != 2 || u.Bytes < done.Bytes+ref.Size || u.Bytes > done.Bytes+ref.Size+2000 {
			t.Fatalf("after completing by a reference to %d bytes: %+v, want 2 records of %d bytes and the reference's", ref.Size, u, done.Bytes+ref.Size)
		}
		if err := s.Purge(ctx(t), d.ID); err != nil {
			t.Fatal(err)
		}
		if u := usage(); u != done {
			t.Fatalf("after purging the key completed by reference: %+v, want %+v as before it", u, done)
		}
	}

	b := claim(id("b"))
	mustAcquire(t, s, b)
	if _, err := s.Release(ctx(t), engine.Release{ID: b.ID, LeaseToken: b.Token, Mode: engine.ReleaseRetry, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if u := usage(); u.Records != 2 {
		t.Fatalf("after a second key released for a retry: %+v, want 2 records", u)
	}
	if err := s.Purge(ctx(t), b.ID); err != nil {
		t.Fatal(err)
	}
	if u := usage(); u != done {
		t.Fatalf("after purging the second key: %+v, want %+v as before it", u, done)
	}

	// A record that expires leaves the count by itself: c is kept 100 ms, and a is
	// purged, so nothing is left once c's retention has passed.
	c := claim(id("c"))
	mustAcquire(t, s, c)
	if _, err := s.Complete(ctx(t), engine.Completion{ID: c.ID, LeaseToken: c.Token, Response: response(body), Retention: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx(t), a.ID); err != nil {
		t.Fatal(err)
	}
	var last engine.Usage
	wait.For(t, 60*time.Second, "the expired record to leave the usage", func() bool {
		last = usage()
		return last.Records == 0
	})
	if last.Bytes != 0 {
		t.Fatalf("no record left, but %d bytes counted", last.Bytes)
	}
	// A key that expired is claimed anew and counted once.
	mustAcquire(t, s, claim(id("c")))
	if u := usage(); u.Records != 1 {
		t.Fatalf("a key claimed again after it expired: %+v, want 1 record", u)
	}
}
