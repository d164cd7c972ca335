package idem

import (
	"container/list"
	"net/http"
	"slices"
	"sync"
	"time"
)

// The replay cache's defaults: see WithReplayCache.
const (
	DefaultReplayCacheBytes  = 16 << 20
	DefaultReplayCacheMaxAge = 30 * time.Second
)

// WithReplayCache sets the bounds of the client's replay cache: at most maxBytes of
// finished results (responses, keys and fingerprints), each kept at most maxAge and
// never past the record's expires_at. Zero for either turns the cache off. The default
// is DefaultReplayCacheBytes and DefaultReplayCacheMaxAge.
//
// A finished record (completed, or failed for good) never changes until it expires or
// is purged, so a claim on a key this client saw finish, with the same fingerprint, is
// answered from memory: Do, Once and Middleware replay it with no call to idemd. The
// cache learns a result when this client's Do, Once or Middleware stores it, and when a
// claim answers with one. A claim with another fingerprint always asks idemd.
//
// A purge through this client is seen at once. A purge through anything else (another
// process, idemctl) is seen by this client within maxAge: until then a claim on the
// purged key replays the result this client saw.
//
// expires_at is the store's time, and this client compares it with its own clock: on a
// host whose clock runs behind, an entry outlives its record by as much, never by more
// than maxAge. Such a late replay answers with the result that was stored; it never
// runs the operation again.
func WithReplayCache(maxBytes int, maxAge time.Duration) Option {
	return func(s *settings) { s.replayBytes, s.replayAge = maxBytes, maxAge }
}

// replayCache keeps finished results by key, least recently used first out.
type replayCache struct {
	maxBytes int
	maxAge   time.Duration

	mu    sync.Mutex
	bytes int
	// purges counts the removals, so that an answer fetched before one is not put
	// back after it.
	purges  uint64
	entries map[string]*list.Element
	order   list.List // of *replayEntry, most recently used at the front
}

type replayEntry struct {
	key         string
	fingerprint string
	outcome     Outcome
	attempt     int64
	// expiresAt is the record's; until is when the entry is dropped: expiresAt or
	// maxAge after it was stored, whichever comes first.
	expiresAt time.Time
	until     time.Time
	response  Response
	size      int
}

func newReplayCache(maxBytes int, maxAge time.Duration) *replayCache {
	if maxBytes <= 0 || maxAge <= 0 {
		return nil
	}
	return &replayCache{maxBytes: maxBytes, maxAge: maxAge, entries: map[string]*list.Element{}}
}

// entryOverhead approximates the bytes of an entry beyond its strings: the entry,
// the list element and the map slot.
const entryOverhead = 256

// get returns the finished claim of key when it is cached with this fingerprint. Its
// response is a copy unless shared, when it is the cache's own, which the caller
// must not change.
func (c *replayCache) get(key, fingerprint string, now time.Time, shared bool) (*Claim, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*replayEntry)
	if !now.Before(e.until) {
		c.removeElement(el)
		return nil, false
	}
	if e.fingerprint != fingerprint {
		return nil, false
	}
	c.order.MoveToFront(el)
	r := e.response
	if !shared {
		// Callers may change what they get; the cache keeps its own copy.
		r = Response{Status: e.response.Status, Header: e.response.Header.Clone(), Body: slices.Clone(e.response.Body)}
	}
	if r.Header == nil {
		r.Header = http.Header{}
	}
	return &Claim{Outcome: e.outcome, Attempt: e.attempt, ExpiresAt: e.expiresAt, Response: &r}, true
}

// generation is taken before asking idemd for a result that may go to put.
func (c *replayCache) generation() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.purges
}

// put remembers a finished result that idemd answered after generation gen was
// taken; when a purge through this client came in between, the result may be the
// purged record's and is not kept. The cache keeps a copy of r.
func (c *replayCache) put(key, fingerprint string, outcome Outcome, attempt int64, expiresAt time.Time, r *Response, now time.Time, gen uint64) {
	if c == nil {
		return
	}
	if r != nil {
		r = &Response{Status: r.Status, Header: r.Header.Clone(), Body: slices.Clone(r.Body)}
	}
	c.keep(key, fingerprint, outcome, attempt, expiresAt, r, now, gen)
}

// keep is put without the copy: r becomes the cache's, and its maker must not
// change it. An entry larger than a sixteenth of the cache is not kept, so that one
// large answer cannot empty it.
func (c *replayCache) keep(key, fingerprint string, outcome Outcome, attempt int64, expiresAt time.Time, r *Response, now time.Time, gen uint64) {
	if c == nil || expiresAt.IsZero() || !now.Before(expiresAt) {
		return
	}
	e := &replayEntry{key: key, fingerprint: fingerprint, outcome: outcome, attempt: attempt,
		expiresAt: expiresAt, until: now.Add(c.maxAge)}
	if expiresAt.Before(e.until) {
		e.until = expiresAt
	}
	if r != nil {
		e.response = *r
	}
	// The body's capacity, not its length: a body kept as its maker wrote it may hold
	// more than it shows.
	e.size = entryOverhead + len(key) + len(fingerprint) + cap(e.response.Body)
	for k, vs := range e.response.Header {
		e.size += len(k)
		for _, v := range vs {
			e.size += len(v) + 16
		}
	}
	if e.size > c.maxBytes/16 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.purges != gen {
		return
	}
	if el, ok := c.entries[key]; ok {
		c.removeElement(el)
	}
	c.entries[key] = c.order.PushFront(e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		c.removeElement(c.order.Back())
	}
}

// remove forgets key, as a purge through this client does.
func (c *replayCache) remove(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.purges++
	if el, ok := c.entries[key]; ok {
		c.removeElement(el)
	}
}

func (c *replayCache) removeElement(el *list.Element) {
	e := c.order.Remove(el).(*replayEntry)
	delete(c.entries, e.key)
	c.bytes -= e.size
}
