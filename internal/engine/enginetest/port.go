package enginetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

// RunPort holds a pair of stores to engine.Porter: records of every state exported
// from a store made by newSource, through the record stream and without it, import
// into one made by newTarget as they were, with their times, and an import never
// overwrites what the target holds. The two may be stores of different kinds; records
// are kept apart from other tests' by a tenant of their own.
func RunPort(t *testing.T, newSource, newTarget NewStore) {
	source, target := newSource(t), newTarget(t)
	t.Cleanup(func() { _ = source.Close(); _ = target.Close() })
	sp, ok := source.(engine.Porter)
	tp, ok2 := target.(engine.Porter)
	if !ok || !ok2 {
		t.Fatalf("%T or %T is no engine.Porter", source, target)
	}
	tenant := fmt.Sprintf("port-%d", time.Now().UnixNano())
	id := func(key string) engine.ID { return engine.ID{Tenant: tenant, Key: key} }
	c := ctx(t)

	// A record in each state, with what each state can carry.
	completed := id("completed ✓ \x00 key")
	tok := engine.NewLeaseToken()
	mustAcquire(t, source, claim(completed, func(c *engine.Claim) { c.Token, c.Fingerprint, c.Owner = tok, "sha256:"+hexOf("fp"), "w1" }))
	complete(t, source, completed, tok, response("done"))

	sealed := id("sealed")
	tok = engine.NewLeaseToken()
	mustAcquire(t, source, claim(sealed, func(c *engine.Claim) { c.Token = tok }))
	complete(t, source, sealed, tok, engine.Response{Status: 200,
		Headers: map[string][]string{engine.SealedHeader: {"1"}}, Body: []byte{0xC1, 1, 2, 3, 0}})

	failed := id("failed")
	tok = engine.NewLeaseToken()
	mustAcquire(t, source, claim(failed, func(c *engine.Claim) { c.Token = tok }))
	if _, err := source.Release(c, engine.Release{ID: failed, LeaseToken: tok, Mode: engine.ReleaseFail,
		Response: &engine.Response{Status: 402, Body: []byte("no funds")}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}

	released := id("released")
	tok = engine.NewLeaseToken()
	mustAcquire(t, source, claim(released, func(c *engine.Claim) { c.Token = tok }))
	if _, err := source.Mark(c, engine.Mark{ID: released, LeaseToken: tok, Name: "charged", Data: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := source.Release(c, engine.Release{ID: released, LeaseToken: tok, Mode: engine.ReleaseRetry, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}

	pending := id("pending")
	pendingToken := engine.NewLeaseToken()
	secret := engine.HashSecret("a claim secret of twenty-two bytes or more")
	mustAcquire(t, source, claim(pending, func(c *engine.Claim) {
		c.Token, c.Secret, c.Owner, c.Lease = pendingToken, secret, "worker-7", 20*time.Second
	}))
	if _, err := source.Mark(c, engine.Mark{ID: pending, LeaseToken: pendingToken, Name: "step-2", Data: []byte{}}); err != nil {
		t.Fatal(err)
	}
	all := []engine.ID{completed, sealed, failed, released, pending}

	// Export, through the stream and without it.
	var exported []engine.Exported
	var stream bytes.Buffer
	sw, err := engine.NewStreamWriter(&stream, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	err = sp.Export(c, func(e engine.Exported) error {
		if e.ID.Tenant != tenant {
			return nil
		}
		exported = append(exported, e)
		return sw.Write(e)
	})
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	if len(exported) != len(all) {
		t.Fatalf("export gave %d records of the tenant, want %d", len(exported), len(all))
	}
	byDigest := map[[32]byte]engine.Exported{}
	for _, e := range exported {
		byDigest[e.KeyDigest] = e
	}
	for _, rid := range all {
		e, ok := byDigest[engine.KeyDigest(rid.Key)]
		if !ok {
			t.Fatalf("export lacks %q", rid.Key)
		}
		if e.ID.Key != "" && e.ID.Key != rid.Key {
			t.Fatalf("export names %q's record %q", rid.Key, e.ID.Key)
		}
		want, err := source.Lookup(c, rid)
		if err != nil {
			t.Fatal(err)
		}
		sameRecord(t, "export of "+rid.Key, e.Record, want)
	}
	if e := byDigest[engine.KeyDigest(pending.Key)]; e.LeaseToken != pendingToken || e.Secret != secret {
		t.Fatalf("export of the pending record has token %q and secret %q, want the lease's", e.LeaseToken, e.Secret)
	}

	// The stream carries the same records, with the lease token's hash only.
	sr, err := engine.NewStreamReader(bytes.NewReader(stream.Bytes()), 0)
	if err != nil {
		t.Fatal(err)
	}
	if sr.Header.Format != engine.StreamFormat || sr.Header.Version != engine.StreamVersion {
		t.Fatalf("header %+v", sr.Header)
	}
	if bytes.Contains(stream.Bytes(), []byte(pendingToken)) {
		t.Fatal("the stream carries a lease token")
	}
	var fromStream []engine.Exported
	for {
		e, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fromStream = append(fromStream, e)
	}
	if len(fromStream) != len(exported) {
		t.Fatalf("the stream has %d records, want %d", len(fromStream), len(exported))
	}
	for i, e := range fromStream {
		if e.LeaseToken != "" {
			t.Fatalf("a record read from the stream has a lease token")
		}
		want := exported[i]
		want.LeaseToken = ""
		if !reflect.DeepEqual(e, want) {
			t.Fatalf("stream round trip:\n got %+v\nwant %+v", e, want)
		}
	}

	// Import into the target: every record as it was, times never renewed.
	for _, e := range exported {
		if got, err := tp.Import(c, e); err != nil || got != engine.ImportWritten {
			t.Fatalf("import of %x: %q, %v; want written", e.KeyDigest[:4], got, err)
		}
	}
	for _, rid := range all {
		want, _ := source.Lookup(c, rid)
		got, err := target.Lookup(c, rid)
		if err != nil {
			t.Fatalf("lookup of %q in the target: %v", rid.Key, err)
		}
		sameRecord(t, "import of "+rid.Key, got, want)
	}

	// Repeated, the import finds what it wrote.
	for _, e := range exported {
		if got, err := tp.Import(c, e); err != nil || got != engine.ImportSame {
			t.Fatalf("import repeated: %q, %v; want same", got, err)
		}
	}

	// The lease goes on in the target: another claim is in progress, the claim secret
	// gets the lease back, the holder's token completes, and the result replays.
	_, err = target.Claim(c, claim(pending))
	var busy *engine.InProgressError
	if !errors.As(err, &busy) || busy.RetryAfter > 20*time.Second {
		t.Fatalf("claim of the moved pending key: %v, want in progress within the lease's 20s", err)
	}
	back, err := target.Claim(c, claim(pending, func(c *engine.Claim) { c.Secret = secret }))
	if err != nil || back.Outcome != engine.OutcomeAcquired || back.Record.LeaseToken != pendingToken || back.Record.Attempt != 1 {
		t.Fatalf("claim with the secret: %+v, %v; want the same lease back", back, err)
	}
	if back.Record.RecoveryPoint == nil || back.Record.RecoveryPoint.Name != "step-2" {
		t.Fatalf("the moved lease lost its recovery point: %+v", back.Record.RecoveryPoint)
	}
	complete(t, target, pending, pendingToken, response("finished after the move"))
	replay, err := target.Claim(c, claim(pending))
	if err != nil || replay.Outcome != engine.OutcomeCompleted || string(replay.Record.Response.Body) != "finished after the move" {
		t.Fatalf("replay after the move: %+v, %v", replay, err)
	}
	// A released key is taken as its next attempt, with the point it was left at.
	next := mustAcquire(t, target, claim(released))
	if next.Attempt != 2 || next.RecoveryPoint == nil || string(next.RecoveryPoint.Data) != "ch_1" {
		t.Fatalf("claim of the moved released key: %+v", next)
	}

	// An import never overwrites: the target's record of a key stays, however the
	// stream's differs.
	old := byDigest[engine.KeyDigest(pending.Key)]
	if got, err := tp.Import(c, old); err != nil || got != engine.ImportKept {
		t.Fatalf("import over a newer record: %q, %v; want kept", got, err)
	}
	if rec, _ := target.Lookup(c, pending); rec.State != engine.StateCompleted {
		t.Fatalf("an import overwrote the completed record: %+v", rec)
	}

	// A record whose retention ran out is not written.
	gone := byDigest[engine.KeyDigest(completed.Key)]
	gone.ID.Key, gone.KeyDigest = "expired", engine.KeyDigest("expired")
	gone.ExpiresAt = time.Now().Add(-time.Second)
	if got, err := tp.Import(c, gone); err != nil || got != engine.ImportExpired {
		t.Fatalf("import of an expired record: %q, %v; want expired", got, err)
	}
	if _, err := target.Lookup(c, id("expired")); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("lookup of the expired import: %v, want not found", err)
	}

	// From the stream, a pending record's lease has a token no caller holds: the holder
	// gets it back with its claim secret, and its old token is refused.
	streamed := fromStream[0]
	for _, e := range fromStream {
		if e.KeyDigest == engine.KeyDigest(pending.Key) {
			streamed = e
		}
	}
	streamed.ID.Key, streamed.KeyDigest = "streamed", engine.KeyDigest("streamed")
	if got, err := tp.Import(c, streamed); err != nil || got != engine.ImportWritten {
		t.Fatalf("import from the stream: %q, %v", got, err)
	}
	if _, err := target.Complete(c, engine.Completion{ID: id("streamed"), LeaseToken: pendingToken, Response: response("x"), Retention: time.Hour}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("complete with a token the stream did not carry: %v, want lease lost", err)
	}
	back, err = target.Claim(c, claim(id("streamed"), func(c *engine.Claim) { c.Secret = secret }))
	if err != nil || back.Outcome != engine.OutcomeAcquired || back.Record.LeaseToken == "" || back.Record.LeaseToken == pendingToken {
		t.Fatalf("claim with the secret after a stream import: %+v, %v", back, err)
	}
	complete(t, target, id("streamed"), back.Record.LeaseToken, response("y"))
}

// sameRecord checks what a move must keep of a record.
func sameRecord(t *testing.T, what string, got, want engine.Record) {
	t.Helper()
	got.ID.Key, want.ID.Key = "", ""
	got.LeaseToken, want.LeaseToken = "", ""
	if !reflect.DeepEqual(normal(got), normal(want)) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// normal is r with empty collections as nil, which stores need not tell apart.
func normal(r engine.Record) engine.Record {
	if r.Response != nil {
		resp := *r.Response
		if len(resp.Headers) == 0 {
			resp.Headers = nil
		}
		if len(resp.Body) == 0 {
			resp.Body = nil
		}
		r.Response = &resp
	}
	if p := r.RecoveryPoint; p != nil {
		point := *p
		if len(point.Data) == 0 {
			point.Data = nil
		}
		r.RecoveryPoint = &point
	}
	return r
}

func hexOf(s string) string { return fmt.Sprintf("%x", engine.KeyDigest(s)) }
