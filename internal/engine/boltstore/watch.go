package boltstore

import "sync"

// watchers wakes the waiters on a record after a transition on it commits. Every
// writer is in this process, so a map of channels replaces the Redis store's Pub/Sub.
type watchers struct {
	mu    sync.Mutex
	byKey map[string]map[*watch]struct{}
}

func (w *watchers) init() { w.byKey = make(map[string]map[*watch]struct{}) }

func (w *watchers) add(key string) *watch {
	x := &watch{c: make(chan struct{}, 1), key: key, from: w}
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.byKey[key]
	if set == nil {
		set = make(map[*watch]struct{})
		w.byKey[key] = set
	}
	set[x] = struct{}{}
	return x
}

func (w *watchers) signal(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for x := range w.byKey[key] {
		select {
		case x.c <- struct{}{}:
		default: // a signal is already pending; signals merge.
		}
	}
}

func (w *watchers) remove(x *watch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.byKey[x.key]
	delete(set, x)
	if len(set) == 0 {
		delete(w.byKey, x.key)
	}
}

// watch implements engine.Watch.
type watch struct {
	c    chan struct{}
	key  string
	from *watchers
	once sync.Once
}

func (x *watch) C() <-chan struct{} { return x.c }

func (x *watch) Close() { x.once.Do(func() { x.from.remove(x) }) }
