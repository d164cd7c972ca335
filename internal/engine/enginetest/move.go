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
