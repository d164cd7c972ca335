package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
)

// memStore is an engine.Store in a map: the rules, a mutex and watches in this process.
// It is the fake behind the Service's tests, a second line after the real stores; it
// passes the conformance suite like them. It is also the smallest example of a store.
type memStore struct {
	mu      sync.Mutex
	records map[engine.ID]engine.Entry
	watches map[engine.ID]map[*memWatch]bool
	// mute drops notifications, as a store does while its notification channel
	// reconnects.
	mute   bool
	claims int
}

func newMemStore() *memStore {
	return &memStore{records: map[engine.ID]engine.Entry{}, watches: map[engine.ID]map[*memWatch]bool{}}
}

// run applies rule to the record of id and stores what it decides.
func (m *memStore) run(id engine.ID, rule func(*engine.Entry, time.Time) engine.Step) engine.Step {
	m.mu.Lock()
	defer m.mu.Unlock()
	var cur *engine.Entry
	if e, ok := m.records[id]; ok {
		cur = &e
	}
	step := rule(cur, time.Now())
	if step.Write {
		m.records[id] = step.Next
		if step.Next.State != engine.StatePending {
			m.signal(id)
		}
	}
	return step
}

func (m *memStore) signal(id engine.ID) {
	if m.mute {
		return
	}
	for w := range m.watches[id] {
		select {
		case w.c <- struct{}{}:
		default:
		}
	}
}

func (m *memStore) Claim(_ context.Context, c engine.Claim) (engine.ClaimResult, error) {
	m.mu.Lock()
	m.claims++
	m.mu.Unlock()
	return m.run(c.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.ClaimStep(cur, c, now) }).ClaimResult()
}

func (m *memStore) Complete(_ context.Context, c engine.Completion) (engine.Record, error) {
	return m.run(c.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.CompleteStep(cur, c, now) }).Result()
}

func (m *memStore) Release(_ context.Context, r engine.Release) (engine.Record, error) {
	return m.run(r.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.ReleaseStep(cur, r, now) }).Result()
}

func (m *memStore) Extend(_ context.Context, e engine.Extension) (engine.Record, error) {
	return m.run(e.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.ExtendStep(cur, e, now) }).Result()
}

// Abandoned lists in key order, past the cursor (the last key of the page before).
func (m *memStore) Abandoned(_ context.Context, q engine.AbandonedQuery) (engine.AbandonedPage, error) {
	if q.Cursor != "" && !strings.HasPrefix(q.Cursor, q.Prefix) {
		return engine.AbandonedPage{}, engine.ErrBadCursor
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []engine.AbandonedKey
	now := time.Now()
	for id, e := range m.records {
		if id.Tenant == q.Tenant && strings.HasPrefix(id.Key, q.Prefix) && id.Key > q.Cursor && e.State == engine.StatePending &&
			!e.LeaseExpiresAt.After(q.Before) && !engine.Expired(e.ExpiresAt, now) {
			k := engine.AbandonedKey{Key: id.Key, Attempt: e.Attempt, Fingerprint: e.Fingerprint, Owner: e.Owner, LeaseExpiredAt: e.LeaseExpiresAt}
			if e.RecoveryPoint != nil {
				k.Point = e.RecoveryPoint.Name
			}
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b engine.AbandonedKey) int { return strings.Compare(a.Key, b.Key) })
	if len(keys) > q.Limit {
		return engine.AbandonedPage{Keys: keys[:q.Limit], Next: keys[q.Limit-1].Key}, nil
	}
	return engine.AbandonedPage{Keys: keys}, nil
}

func (m *memStore) Mark(_ context.Context, mk engine.Mark) (engine.Record, error) {
	return m.run(mk.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.MarkStep(cur, mk, now) }).Result()
}

func (m *memStore) Lookup(_ context.Context, id engine.ID) (engine.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.records[id]
	if !ok || engine.Expired(e.ExpiresAt, time.Now()) {
		return engine.Record{}, engine.ErrNotFound
	}
	return e.Record, nil
}

func (m *memStore) Purge(_ context.Context, id engine.ID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.records[id]
	if !ok || engine.Expired(e.ExpiresAt, time.Now()) {
		return engine.ErrNotFound
	}
	delete(m.records, id)
	m.signal(id)
	return nil
}

type memWatch struct {
	c     chan struct{}
	close func()
}

func (w *memWatch) C() <-chan struct{} { return w.c }
func (w *memWatch) Close()             { w.close() }

func (m *memStore) Watch(_ context.Context, id engine.ID) (engine.Watch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &memWatch{c: make(chan struct{}, 1)}
	w.close = func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.watches[id], w)
	}
	if m.watches[id] == nil {
		m.watches[id] = map[*memWatch]bool{}
	}
	m.watches[id][w] = true
	return w, nil
}

func (m *memStore) Ping(context.Context) error { return nil }
func (m *memStore) Close() error               { return nil }

func TestMemStoreConformance(t *testing.T) {
	enginetest.Run(t, func(*testing.T) engine.Store { return newMemStore() })
}
