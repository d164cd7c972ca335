package boltstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// maxGroup bounds the transitions of one commit, so that one write transaction stays
// small next to the fsync it shares and a burst cannot hold the writer for long.
const maxGroup = 1000

// committer commits transitions in groups without waiting on a timer. One loop owns
// the writes: a transition that arrives while no commit runs is committed at once;
// those that arrive during a commit (its fsync) gather and all go into the next write
// transaction, in the order they arrived, with one fsync between them. Under load a
// group is as large as what arrived during one fsync; alone, a transition pays nothing.
type committer struct {
	db *bolt.DB

	mu     sync.Mutex
	queue  []*pending
	closed bool

	wake   chan struct{} // holds one signal: the queue may have work
	stop   chan struct{}
	exited chan struct{}

	// onTx, when set, is called before each write transaction with its number of
	// transitions; tests use it to hold a group and to count commits.
	onTx func(size int)
}

// pending is one transition waiting for its group.
type pending struct {
	ctx context.Context
	fn  func(*bolt.Tx) error
	// after runs on the loop once the transition is committed, whether or not its
	// caller still waits: what must follow a write (waking waiters) never depends on
	// the caller.
	after func()
	state atomic.Int32
	done  chan error // buffered: the loop never waits for the caller
}

// The states of a pending transition. The caller and the loop each move it out of
// queued with a compare-and-swap, so exactly one of them decides its fate.
const (
	queued int32 = iota
	taken
	abandoned
)

func newCommitter(db *bolt.DB) *committer {
	c := &committer{db: db, wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
	go c.loop()
	return c
}

// run commits fn in the next group and returns its error or the commit's; after runs
// once fn is committed. fn must be safe to run more than once (a failing neighbour
// makes the group run again) and keep its effects in variables it resets at each run.
// A transition whose ctx ends before its group starts is never applied and returns
// ctx's error. One whose ctx ends while its group commits returns ctx's error too, at
// once, and may still be committed: a disk that stops answering holds the commit, not
// the caller, who hears that the store did not answer in time, as from Redis.
func (c *committer) run(ctx context.Context, fn func(*bolt.Tx) error, after func()) error {
	p := &pending{ctx: ctx, fn: fn, after: after, done: make(chan error, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return bolterrors.ErrDatabaseNotOpen
	}
	c.queue = append(c.queue, p)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // a signal is already pending; the loop will find this one too.
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		p.state.CompareAndSwap(queued, abandoned)
		return ctx.Err()
	}
}

// runAll is run for many transitions at once: they join the queue together, so that
// they commit in one group (or as few as maxGroup allows) rather than one after
// another, and it answers each one's error in their order.
func (c *committer) runAll(ctx context.Context, fns []func(*bolt.Tx) error, afters []func()) []error {
	errs := make([]error, len(fns))
	ps := make([]*pending, len(fns))
	for i, fn := range fns {
		ps[i] = &pending{ctx: ctx, fn: fn, after: afters[i], done: make(chan error, 1)}
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		for i := range errs {
			errs[i] = bolterrors.ErrDatabaseNotOpen
		}
		return errs
	}
	c.queue = append(c.queue, ps...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	for i, p := range ps {
		select {
		case errs[i] = <-p.done:
		case <-ctx.Done():
			if p.state.CompareAndSwap(queued, abandoned) {
				errs[i] = ctx.Err()
				continue
			}
			// Taken already: its group answers it.
			errs[i] = <-p.done
		}
	}
	return errs
}

// close refuses new transitions, lets the loop commit those already queued, and
// returns once it has stopped.
func (c *committer) close() {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	if !already {
		close(c.stop)
	}
	<-c.exited
}

func (c *committer) loop() {
	defer close(c.exited)
	for {
		select {
		case <-c.wake:
			for c.commitNext() {
			}
		case <-c.stop:
			// Nothing can join the queue any more; what is in it is committed.
			for c.commitNext() {
			}
			return
		}
	}
}

// commitNext commits up to maxGroup queued transitions; it reports false when the
// queue was empty.
func (c *committer) commitNext() bool {
	c.mu.Lock()
	n := min(len(c.queue), maxGroup)
	group := c.queue[:n:n]
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	c.mu.Unlock()
	if n == 0 {
		return false
	}
	live := group[:0]
	for _, p := range group {
		if !p.state.CompareAndSwap(queued, taken) {
			continue // its caller has gone
		}
		if err := p.ctx.Err(); err != nil {
			p.done <- err
			continue
		}
		live = append(live, p)
	}
	c.commit(live)
	return true
}

// commit runs the group's transitions in order in one write transaction, so that two
// on the same record see each other's writes as if each ran alone, and answers each
// after the fsync. A transition that fails (a real failure, not an answer such as not
// found) rolls the transaction back; as DB.Batch does, the others are then committed
// without it, in the same order, and it runs alone for its own answer.
func (c *committer) commit(group []*pending) {
	for len(group) > 0 {
		failed := -1
		err := c.update(len(group), func(tx *bolt.Tx) error {
			for i, p := range group {
				if err := call(p.fn, tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, p := range group {
				p.finish(err)
			}
			return
		}
		c.commit(group[:failed])
		p := group[failed]
		p.finish(c.update(1, func(tx *bolt.Tx) error { return call(p.fn, tx) }))
		group = group[failed+1:]
	}
}

// finish answers the transition, after running its after when it was committed.
func (p *pending) finish(err error) {
	if err == nil && p.after != nil {
		p.after()
	}
	p.done <- err
}

func (c *committer) update(size int, fn func(*bolt.Tx) error) error {
	if c.onTx != nil {
		c.onTx(size)
	}
	return c.db.Update(fn)
}

// call runs fn, turning a panic into that transition's error, as DB.Batch does, so
// that one bad transition cannot take the loop and every later write down with it.
func call(fn func(*bolt.Tx) error, tx *bolt.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("transition panicked: %v", r)
		}
	}()
	return fn(tx)
}
