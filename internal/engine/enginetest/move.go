package enginetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

// RunMove holds a live move to its promises, from a store made by newOld (an
// engine.Mover) to one made by newNew (an engine.Porter): while clients claim and
// complete keys concurrently through a daemon of the old store alone and through
// migrating daemons, and the copier runs (and is stopped half-way and restarted), no
// key is ever acquired twice; a lease granted before the move is extended, marked and
// completed after it, and a claim resent with its secret gets it back; every key ends
// handed over, and once the old store is closed every completed result replays from
// the new one byte for byte.
func RunMove(t *testing.T, newOld, newNew NewStore) {
	old, next := newOld(t), newNew(t)
	t.Cleanup(func() { _ = old.Close(); _ = next.Close() })
	c := ctx(t)
	tenant := fmt.Sprintf("move-%d", time.Now().UnixNano())
	id := func(key string) engine.ID { return engine.ID{Tenant: tenant, Key: key} }

	// Before the move: a completed key, a held one, a released one.
	completed := id("completed")
	tok := engine.NewLeaseToken()
	mustAcquire(t, old, claim(completed, func(c *engine.Claim) { c.Token = tok }))
	complete(t, old, completed, tok, response("done before"))
	held := id("held")
	heldTok := engine.NewLeaseToken()
	secret := engine.HashSecret("the held key's claim secret, long enough")
	mustAcquire(t, old, claim(held, func(c *engine.Claim) { c.Token, c.Secret, c.Lease = heldTok, secret, time.Minute }))
	released := id("released")
	tok = engine.NewLeaseToken()
	mustAcquire(t, old, claim(released, func(c *engine.Claim) { c.Token = tok }))
	if _, err := old.Mark(c, engine.Mark{ID: released, LeaseToken: tok, Name: "charged", Data: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Release(c, engine.Release{ID: released, LeaseToken: tok, Mode: engine.ReleaseRetry, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	const keys = 40
	for i := range keys / 2 {
		// Half the load's keys exist before the move.
		k := id(fmt.Sprintf("load-%d", i))
		tk := engine.NewLeaseToken()
		mustAcquire(t, old, claim(k, func(c *engine.Claim) { c.Token = tk }))
		complete(t, old, k, tk, response(fmt.Sprintf("result %d", i)))
	}

	m, err := engine.NewMigrator(next, old)
	if err != nil {
		t.Fatal(err)
	}
	// Only a claim seals a key neither store holds: the other calls create no record,
	// and write nothing into the old store.
	never := id("never seen")
	if _, err := m.Lookup(c, never); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("a lookup of a key neither store holds: %v", err)
	}
	if _, err := m.Complete(c, engine.Completion{ID: never, LeaseToken: "x", Response: response("x"), Retention: time.Hour}); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("a completion of a key neither store holds: %v", err)
	}
	if _, err := old.Lookup(c, never); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("the old store after a lookup and a completion of a key it does not hold: %v", err)
	}

	// A waiter on the held key in the old store is woken when the key is handed over.
	waiter, err := old.Watch(c, held)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()

	// The load: claims on every key, through the old store directly (a daemon not yet
	// restarted as a migrating one) and through the migrator, while the copier runs.
	var mu sync.Mutex
	acquired := map[string]int{}
	results := map[string]string{}
	var wg sync.WaitGroup
	worker := func(s engine.Store, name string, step int) {
		defer wg.Done()
		for round := range 3 {
			for i := range keys {
				// Each worker its own order, so that every kind of daemon comes
				// first to some keys.
				k := id(fmt.Sprintf("load-%d", ((i*step+round*7)%keys+keys)%keys))
				tk := engine.NewLeaseToken()
				res, err := s.Claim(c, claim(k, func(c *engine.Claim) { c.Token = tk }))
				var busy *engine.InProgressError
				switch {
				case errors.Is(err, engine.ErrStoreMoved), errors.As(err, &busy):
					continue
				case err != nil:
					t.Errorf("%s: claim %s: %v", name, k.Key, err)
					return
				case res.Outcome != engine.OutcomeAcquired:
					continue
				}
				body := fmt.Sprintf("%s by %s", k.Key, name)
				mu.Lock()
				acquired[k.Key]++
				n := acquired[k.Key]
				mu.Unlock()
				if n > 1 {
					t.Errorf("%s acquired a second time, by %s", k.Key, name)
				}
				if _, err := s.Complete(c, engine.Completion{ID: k, LeaseToken: tk, Response: response(body), Retention: time.Hour}); err != nil {
					if !errors.Is(err, engine.ErrStoreMoved) {
						t.Errorf("%s: complete %s: %v", name, k.Key, err)
					}
					continue
				}
				mu.Lock()
				results[k.Key] = body
				mu.Unlock()
			}
		}
	}
	wg.Add(4)
	go worker(old, "the old store's daemon", 1)
	go worker(m, "migrating daemon 1", -1)
	go worker(m, "migrating daemon 2", 3)
	go worker(old, "another of the old store's daemons", -3)

	// The copier, stopped after a few keys and started again.
	stop, cancel := context.WithCancel(c)
	n := 0
	_, err = m.CopyAll(stop, func(engine.MoveProgress) {
		if n++; n == 5 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the copier stopped half-way: %v", err)
	}
	wg.Wait()
	p, err := m.CopyAll(c, nil)
	if err != nil || !p.Done {
		t.Fatalf("the copier: %+v %v", p, err)
	}

	select {
	case <-waiter.C():
	case <-time.After(wait.Scale(20 * time.Second)):
		t.Fatal("a waiter on the held key in the old store was not woken by its handover")
	}

	// The lease granted before the move goes on through the migrating daemon.
	if res, err := m.Claim(c, claim(held, func(c *engine.Claim) { c.Secret = secret })); err != nil || res.Outcome != engine.OutcomeAcquired || res.Record.LeaseToken != heldTok {
		t.Fatalf("the held key's claim resent with its secret after the move: %+v %v", res, err)
	}
	if _, err := m.Extend(c, engine.Extension{ID: held, LeaseToken: heldTok, Lease: time.Minute}); err != nil {
		t.Fatalf("extending a lease granted before the move: %v", err)
	}
	if _, err := m.Mark(c, engine.Mark{ID: held, LeaseToken: heldTok, Name: "step"}); err != nil {
		t.Fatalf("a recovery point under a lease granted before the move: %v", err)
	}
	if _, err := m.Complete(c, engine.Completion{ID: held, LeaseToken: heldTok, Response: response("held, done"), Retention: time.Hour}); err != nil {
		t.Fatalf("completing a lease granted before the move: %v", err)
	}
	if res, err := m.Claim(c, claim(released)); err != nil || res.Outcome != engine.OutcomeAcquired || res.Record.RecoveryPoint == nil || string(res.Record.RecoveryPoint.Data) != "ch_1" {
		t.Fatalf("the released key after the move: %+v %v", res, err)
	}

	// The old store keeps only markers, and refuses every key.
	var left int
	if _, err := old.(engine.Mover).Unmoved(c, func(string, [32]byte, string) error { left++; return nil }); err != nil || left != 0 {
		t.Fatalf("the old store after the copier: %d keys left (%v)", left, err)
	}
	for _, k := range []engine.ID{completed, held, id("load-0"), id("load-39")} {
		if _, err := old.Claim(c, claim(k)); !errors.Is(err, engine.ErrStoreMoved) {
			t.Fatalf("a claim on %s in the old store after the move: %v", k.Key, err)
		}
	}

	// Quotas and the store guard read the new store's usage and fill through the
	// migrating store.
	if r, ok := next.(engine.UsageReader); ok {
		want, err1 := r.Usage(c, tenant)
		got, err2 := m.Usage(c, tenant)
		if err1 != nil || err2 != nil || got != want {
			t.Fatalf("the migrating store's usage %+v (%v), the new store's %+v (%v)", got, err2, want, err1)
		}
	}
	if r, ok := next.(engine.FillReader); ok {
		if _, err := r.Fill(c); err == nil {
			if _, err := m.Fill(c); err != nil {
				t.Fatalf("the migrating store's fill: %v", err)
			}
		}
	}

	// Retire the old store: the new one replays every result, byte for byte.
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	replays := map[string]string{completed.Key: "done before", held.Key: "held, done"}
	for i := range keys / 2 {
		replays[fmt.Sprintf("load-%d", i)] = fmt.Sprintf("result %d", i)
	}
	for k, body := range results {
		replays[k] = body
	}
	for k, body := range replays {
		res, err := next.Claim(c, claim(id(k)))
		if err != nil || res.Outcome != engine.OutcomeCompleted || res.Record.Response == nil || !bytes.Equal(res.Record.Response.Body, []byte(body)) {
			t.Fatalf("%s from the new store alone: %+v %v, want %q", k, res, err, body)
		}
	}
}

// RunMoveBatch holds the batch steps of a live move's copier (Mover.MoveOutBatch,
// ConfirmMovedBatch, UnmovedBatches, and the new store's import of a batch) to what
// each key's step does alone, in one batch of keys in every state a move meets: a
// completed record and a held lease are handed over whole, a moving marker answers the
// record it keeps, a moved marker and a key with no record are sealed; the imports are
// written once and found the same when run again; once confirmed, nothing is left to
// hand over, and the lease goes on in the new store with its token.
func RunMoveBatch(t *testing.T, newOld, newNew NewStore) {
	old, next := newOld(t), newNew(t)
	t.Cleanup(func() { _ = old.Close(); _ = next.Close() })
	c := ctx(t)
	tenant := fmt.Sprintf("batch-%d", time.Now().UnixNano())
	id := func(key string) engine.ID { return engine.ID{Tenant: tenant, Key: key} }
	mover := old.(engine.Mover)
	until := time.Now().Add(engine.MarkerLife)

	completed, held, moving, moved, absent := id("completed"), id("held"), id("moving"), id("moved"), id("absent")
	tok := engine.NewLeaseToken()
	mustAcquire(t, old, claim(completed, func(c *engine.Claim) { c.Token = tok }))
	complete(t, old, completed, tok, response("done before"))
	heldTok := engine.NewLeaseToken()
	secret := engine.HashSecret("the held key's claim secret, long enough")
	mustAcquire(t, old, claim(held, func(c *engine.Claim) { c.Token, c.Secret, c.Lease = heldTok, secret, time.Minute }))
	for _, k := range []engine.ID{moving, moved} {
		tk := engine.NewLeaseToken()
		mustAcquire(t, old, claim(k, func(c *engine.Claim) { c.Token = tk }))
		complete(t, old, k, tk, response(k.Key))
	}
	if o, _, err := mover.MoveOut(c, tenant, engine.KeyDigest(moving.Key), moving.Key, true, until); err != nil || o != engine.MoveHandingOver {
		t.Fatalf("moving out %s alone: %v %v", moving.Key, o, err)
	}
	if _, _, err := mover.MoveOut(c, tenant, engine.KeyDigest(moved.Key), moved.Key, true, until); err != nil {
		t.Fatal(err)
	}
	if err := mover.ConfirmMoved(c, tenant, engine.KeyDigest(moved.Key), until); err != nil {
		t.Fatal(err)
	}

	keyOf := func(k engine.ID) engine.MoveKey {
		return engine.MoveKey{Tenant: k.Tenant, Digest: engine.KeyDigest(k.Key), Key: k.Key}
	}
	keys := []engine.MoveKey{keyOf(completed), keyOf(held), keyOf(moving), keyOf(moved), keyOf(absent)}
	outs := mover.MoveOutBatch(c, keys, true, until)
	if len(outs) != len(keys) {
		t.Fatalf("MoveOutBatch answered %d keys of %d", len(outs), len(keys))
	}
	want := []engine.MoveOutcome{engine.MoveHandingOver, engine.MoveHandingOver, engine.MoveHandingOver, engine.MoveSealed, engine.MoveSealed}
	var records []engine.Exported
	for i, o := range outs {
		if o.Err != nil || o.Outcome != want[i] || (o.Outcome == engine.MoveHandingOver) != (o.Record != nil) {
			t.Fatalf("MoveOutBatch on %s: %+v, want %s", keys[i].Key, o, want[i])
		}
		if o.Record != nil {
			if o.Record.KeyDigest != keys[i].Digest {
				t.Fatalf("MoveOutBatch on %s answered another key's record", keys[i].Key)
			}
			e := *o.Record
			if e.ID.Key == "" {
				e.ID.Key = keys[i].Key
			}
			records = append(records, e)
		}
	}
	if records[0].Response == nil || string(records[0].Response.Body) != "done before" {
		t.Fatalf("the completed key's record, handed over: %+v", records[0])
	}
	if records[1].LeaseToken != heldTok || records[1].State != engine.StatePending {
		t.Fatalf("the held key's record, handed over: %+v", records[1])
	}
	// Every key of the batch is refused by the old store now, the one it held no
	// record of too (sealed).
	for _, k := range []engine.ID{completed, held, moving, moved, absent} {
		if _, err := old.Claim(c, claim(k)); !errors.Is(err, engine.ErrStoreMoved) {
			t.Fatalf("a claim on %s in the old store after MoveOutBatch: %v", k.Key, err)
		}
	}

	imported := engine.ImportAll(c, next.(engine.Porter), records)
	for i, r := range imported {
		if r.Err != nil || r.Outcome != engine.ImportWritten {
			t.Fatalf("importing %s: %+v", records[i].ID.Key, r)
		}
	}
	for i, r := range engine.ImportAll(c, next.(engine.Porter), records) {
		if r.Err != nil || r.Outcome != engine.ImportSame {
			t.Fatalf("importing %s again: %+v", records[i].ID.Key, r)
		}
	}
	for i, err := range mover.ConfirmMovedBatch(c, keys[:3], until) {
		if err != nil {
			t.Fatalf("ConfirmMovedBatch on %s: %v", keys[i].Key, err)
		}
	}

	// Nothing is left to hand over: Unmoved lists nothing, and whatever UnmovedBatches
	// lists is a moved marker, which MoveOutBatch seals and leaves.
	if _, err := mover.Unmoved(c, func(_ string, _ [32]byte, key string) error {
		return fmt.Errorf("%q is left to hand over", key)
	}); err != nil {
		t.Fatal(err)
	}
	var listed []engine.MoveKey
	var listedMu sync.Mutex
	if err := mover.UnmovedBatches(c, func(ks []engine.MoveKey) error {
		listedMu.Lock()
		defer listedMu.Unlock()
		for _, k := range ks {
			if k.Tenant == tenant {
				listed = append(listed, k)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, o := range mover.MoveOutBatch(c, listed, true, until) {
		if o.Err != nil || o.Outcome != engine.MoveSealed {
			t.Fatalf("MoveOutBatch on a key listed after the handover, %x: %+v", listed[i].Digest[:4], o)
		}
	}

	// The new store serves the keys: the lease goes on with its token, the results
	// replay.
	if res, err := next.Claim(c, claim(held, func(c *engine.Claim) { c.Secret = secret })); err != nil || res.Outcome != engine.OutcomeAcquired || res.Record.LeaseToken != heldTok {
		t.Fatalf("the held key's claim resent with its secret in the new store: %+v %v", res, err)
	}
	for k, body := range map[engine.ID]string{completed: "done before", moving: "moving"} {
		res, err := next.Claim(c, claim(k))
		if err != nil || res.Outcome != engine.OutcomeCompleted || res.Record.Response == nil || string(res.Record.Response.Body) != body {
			t.Fatalf("%s from the new store: %+v %v", k.Key, res, err)
		}
	}
}
