package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultPipelines is Options.Pipelines when it is not set.
const DefaultPipelines = 2

// On a slow link a lane lets more pipelines go at once: its base number once more for
// every growthStep of the shortest round trip of its recent pipelines, up to
// maxGrowth times as many. A call then waits about growthStep/base for a pipeline to
// leave rather than a whole round trip for one to come back. A Redis on a fast link
// answers a full pipeline well within growthStep even when busy, so there the lane
// keeps its base number, and its batches.
const (
	growthStep = 10 * time.Millisecond
	maxGrowth  = 8
	// floorWindow is how long a lane's shortest round trip is kept: the floor is
	// the shorter of this window's and the last's.
	floorWindow = time.Second
)

// maxBatch bounds the calls one pipeline carries, so that one pipeline's answers do
// not hold its connection, and Redis's other clients, for long.
const maxBatch = 128

// DefaultLaneIdle is how long a master's lane stays after its last call. A Cluster's
// masters change address as nodes are replaced (a restarted pod comes back on a new
// address), so lanes are retired when unused rather than kept for every address seen.
const DefaultLaneIdle = time.Minute

// errClosed answers the calls made after Close, and those still queued at Close.
var errClosed = errors.New("redis store closed")

// pipeliner sends the scripts of concurrent calls to Redis as pipelines, batching
// naturally rather than by a timer. A few pipelines may be in flight at once (slots).
// A call that finds a slot free goes out at once, alone, from its caller's goroutine;
// calls that arrive while every slot is taken queue, and a worker takes one, waits for
// a slot, adds whatever else is queued by then and sends the lot as one pipeline, and
// goes back to the queue while it is in flight.
// Redis then reads, runs and answers many scripts per system call, and go-redis
// writes and reads them with one system call each way, which is where much of the CPU
// of a single script went, on both sides.
//
// Several slots, rather than one, keep a slow pipeline (a large answer, a WAIT for
// replicas) from stalling every call behind it. A lane whose every pipeline takes
// long, because its master is far, has more slots (growthStep). On a Cluster each
// master has slots, a queue and a worker of its own (a lane), so that a master that
// stops answering holds up only the calls for its own keys, as it did when every call
// went alone. A lane unused for a while (laneIdle to twice that) is retired and its
// worker stops; the next call for its master starts a new one.
type pipeliner struct {
	client Client
	// base is how many pipelines a lane has in flight at once on a fast link.
	base int
	// acks, when positive, makes every write wait for that many replicas, at most
	// ackTimeout (see sendReplicated).
	acks       int
	ackTimeout time.Duration
	// laneIdle is how long an unused lane stays; set before the first call.
	laneIdle time.Duration

	// mu guards lanes and orders sends on their queues before Close: a call that saw
	// closed unset is in its queue before Close answers the queued calls.
	mu     sync.RWMutex
	closed bool
	lanes  map[string]*lane
	quit   chan struct{}
	wg     sync.WaitGroup
	// sweeping is set once the goroutine that retires unused lanes runs.
	sweeping bool
}

// lane is the queue and the slots of the calls for one master, and one worker.
type lane struct {
	queue chan *call
	// handed passes a slot to the worker that waits for one (waiting), as a
	// pipeline lands or the lane's slots grow; no call going alone can take it first.
	handed chan struct{}
	// mu guards the slots, how many are taken, whether the worker waits, and the
	// shortest round trip of the lane's recent pipelines: of this window (cur, since
	// window) and of the last (prev).
	mu        sync.Mutex
	slots     int
	flying    int
	waiting   bool
	window    time.Time
	cur, prev time.Duration
	// pending counts the calls queued or taken by a worker that waits for a slot.
	pending atomic.Int64
	// used is set by every call and cleared by each sweep; a sweep that finds it
	// clear, with nothing queued or in flight, retires the lane.
	used atomic.Bool
	// retired is closed when the lane leaves lanes; its worker then returns.
	retired chan struct{}
}

// call is one script of one caller, with the caller's context. The worker sets val
// and err, then closes done.
type call struct {
	ctx    context.Context
	script script
	keys   []string // the record's keys, in one slot
	args   []any
	val    any
	err    error
	done   chan struct{}
}

func (c *call) finish(val any, err error) {
	c.val, c.err = val, err
	close(c.done)
}

func newPipeliner(client Client, opts Options) *pipeliner {
	base := opts.Pipelines
	if base <= 0 {
		base = DefaultPipelines
	}
	return &pipeliner{client: client, base: base, lanes: make(map[string]*lane), quit: make(chan struct{}),
		acks: opts.ReplicaAcks, ackTimeout: opts.ReplicaTimeout, laneIdle: DefaultLaneIdle}
}

// do runs script on key in the next pipeline and returns its answer, or ctx's error
// as soon as ctx is done: a caller never waits on another's pipeline past its own
// deadline. A call whose ctx is done before its pipeline goes out is not sent.
func (p *pipeliner) do(ctx context.Context, script script, keys []string, args []any) (any, error) {
	// The lane only sorts calls by master; the pipeline itself routes each call by
	// the slot map it has when it goes out, and follows MOVED and ASK.
	master, err := p.client.MasterFor(ctx, keys[0])
	if err != nil {
		return nil, err
	}
	addr := master.Options().Addr
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	p.mu.RLock()
	l := p.lanes[addr]
	for l == nil && !p.closed {
		// Looked up again under the read lock: a sweep may retire a lane between its
		// start and this call's use of it.
		p.mu.RUnlock()
		p.startLane(addr)
		p.mu.RLock()
		l = p.lanes[addr]
	}
	if p.closed {
		p.mu.RUnlock()
		return nil, errClosed
	}
	// Under the read lock a sweep cannot retire l: it takes the write lock, and a
	// call holds the read lock until it has a slot or is counted in pending.
	if !l.used.Load() {
		l.used.Store(true)
	}
	if p.fly(l) {
		// Alone, the call runs on its own context, as a script run directly would;
		// Close waits for it.
		p.wg.Add(1)
		p.mu.RUnlock()
		p.send(l, []*call{c}, true)
		l.land()
		p.wg.Done()
		return c.val, c.err
	}
	l.pending.Add(1)
	select {
	case l.queue <- c:
		p.mu.RUnlock()
	case <-ctx.Done():
		l.pending.Add(-1)
		p.mu.RUnlock()
		return nil, ctx.Err()
	}
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		select {
		case <-c.done:
			return c.val, c.err
		default:
			return nil, ctx.Err()
		}
	}
}

// startLane starts the lane of the master at addr unless it has one.
func (p *pipeliner) startLane(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lanes[addr] != nil || p.closed {
		return
	}
	l := &lane{queue: make(chan *call, 4*maxBatch), handed: make(chan struct{}, 1), slots: p.base, retired: make(chan struct{})}
	l.used.Store(true)
	p.lanes[addr] = l
	p.wg.Add(1)
	go p.work(l)
	if !p.sweeping {
		p.sweeping = true
		p.wg.Add(1)
		go p.sweep()
	}
}

// sweep retires, every laneIdle, the lanes that no call used since the sweep before
// and that have nothing queued or in flight, until Close.
func (p *pipeliner) sweep() {
	defer p.wg.Done()
	tick := time.NewTicker(p.laneIdle)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-p.quit:
			return
		}
		p.mu.Lock()
		for addr, l := range p.lanes {
			if l.used.Load() {
				l.used.Store(false)
				continue
			}
			if l.pending.Load() == 0 && l.idle() {
				delete(p.lanes, addr)
				close(l.retired)
			}
		}
		p.mu.Unlock()
	}
}

// lanesOpen is how many lanes there are.
func (p *pipeliner) lanesOpen() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.lanes)
}

// queued is how many calls wait for a pipeline.
func (p *pipeliner) queued() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := 0
	for _, l := range p.lanes {
		n += int(l.pending.Load())
	}
	return n
}

// close answers errClosed to every call still queued and returns once the workers
// have exited and the pipelines in flight have their answers.
func (p *pipeliner) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	// No call or lane is added from here on; the queued calls are answered here or,
	// when a worker took them first, by that worker.
	close(p.quit)
	for _, l := range p.lanes {
		for drained := false; !drained; {
			select {
			case c := <-l.queue:
				l.pending.Add(-1)
				c.finish(nil, errClosed)
			default:
				drained = true
			}
		}
	}
	p.wg.Wait()
}

func (p *pipeliner) work(l *lane) {
	defer p.wg.Done()
	for {
		var first *call
		select {
		case first = <-l.queue:
		case <-p.quit:
			return
		case <-l.retired:
			return
		}
		if !l.takeOrWait() {
			select {
			case <-l.handed:
			case <-p.quit:
				l.pending.Add(-1)
				first.finish(nil, errClosed)
				return
			}
		}
		batch := drain(l, first)
		select {
		case <-p.quit:
			for _, c := range batch {
				c.finish(nil, errClosed)
			}
			l.land()
			return
		default:
		}
		// The worker is counted in wg until it returns, so this Add cannot race
		// Close's Wait. The pipeline's goroutine keeps its slot for the calls queued
		// by the time its answers come, as long as there are some.
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for batch != nil {
				p.send(l, batch, false)
				batch = p.more(l)
			}
			l.land()
		}()
	}
}

// drain makes a pipeline of first and the calls queued behind it.
func drain(l *lane, first *call) []*call {
	batch := make([]*call, 1, maxBatch)
	batch[0] = first
	for len(batch) < maxBatch {
		select {
		case c := <-l.queue:
			batch = append(batch, c)
		default:
			l.pending.Add(-int64(len(batch)))
			return batch
		}
	}
	l.pending.Add(-int64(len(batch)))
	return batch
}

// more is the next pipeline of queued calls for a slot that has just come back, or
// nil when none is queued, when the worker waits for a slot (it holds the oldest
// call) or when the store is closing.
func (p *pipeliner) more(l *lane) []*call {
	select {
	case <-p.quit:
		return nil
	default:
	}
	l.mu.Lock()
	waiting := l.waiting
	l.mu.Unlock()
	if waiting {
		return nil
	}
	select {
	case c := <-l.queue:
		return drain(l, c)
	default:
		return nil
	}
}

// fly takes one of l's slots for a call going alone, if one is free and the worker
// does not wait for it.
func (p *pipeliner) fly(l *lane) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flying < l.slots && !l.waiting {
		l.flying++
		return true
	}
	return false
}

// takeOrWait takes a slot for the worker if one is free; if not, the next one is
// handed over on l.handed.
func (l *lane) takeOrWait() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flying < l.slots {
		l.flying++
		return true
	}
	l.waiting = true
	return false
}

// land gives a slot back, to the worker if it waits for one.
func (l *lane) land() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting && l.flying-1 < l.slots {
		l.waiting = false
		l.handed <- struct{}{} // one at a time: waiting is set again only after a receive
		return
	}
	l.flying--
}

// floor is the shortest round trip of l's recent pipelines; l.mu must be held.
func (l *lane) floor() time.Duration {
	if l.prev > 0 && l.prev < l.cur {
		return l.prev
	}
	return l.cur
}

// idle says whether no pipeline of l is in flight.
func (l *lane) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flying == 0
}

// observe records the round trip of a pipeline that every call of came back from,
// and sets l's slots from the shortest lately: base, more on a slow link.
func (p *pipeliner) observe(l *lane, d time.Duration) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.window) > floorWindow {
		l.prev, l.cur, l.window = l.cur, d, now
	} else if d < l.cur {
		l.cur = d
	}
	floor := l.floor()
	l.slots = p.base * min(max(int((floor+growthStep-1)/growthStep), 1), maxGrowth)
	if l.waiting && l.flying < l.slots {
		l.flying++
		l.waiting = false
		l.handed <- struct{}{}
	}
	l.mu.Unlock()
}

// send runs batch as one pipeline (go-redis splits a Cluster pipeline by node and
// follows MOVED and ASK itself). Scripts the server does not know yet, after a
// restart or a SCRIPT FLUSH, answer NOSCRIPT each; those are sent again in full with
// EVAL, in a second pipeline.
//
// A call sent alone (own) runs under its caller's context, as a script run directly
// would: a caller that hangs up stops waiting at once.
func (p *pipeliner) send(l *lane, batch []*call, own bool) {
	live := make([]*call, 0, len(batch))
	// The pipeline must not fail because one caller left: it runs until the latest
	// deadline among its calls, or without one if any call has none (the daemon
	// gives every store call a deadline).
	var latest time.Time
	bounded := true
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.finish(nil, err)
			continue
		}
		if d, ok := c.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(latest) {
			latest = d
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if own && len(live) == 1 {
		ctx = live[0].ctx
	} else if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	start := time.Now()
	p.run(ctx, live)
	// Only a pipeline that came back whole tells the link's round trip: one that ran
	// into a deadline or a missing replica's WAIT timeout says nothing of it.
	for _, c := range live {
		if c.err != nil {
			return
		}
	}
	p.observe(l, time.Since(start))
}

// doAll runs calls (each with its done channel) as one pipeline under ctx, straight
// rather than through the lanes: a caller with many scripts at once (the live move's
// copier, a copy's import) makes its own batch, and on a Cluster go-redis splits it
// by master and sends to every master at once. It answers every call.
func (p *pipeliner) doAll(ctx context.Context, calls []*call) {
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		for _, c := range calls {
			c.finish(nil, errClosed)
		}
		return
	}
	p.wg.Add(1)
	p.mu.RUnlock()
	defer p.wg.Done()
	if err := ctx.Err(); err != nil {
		for _, c := range calls {
			c.finish(nil, err)
		}
		return
	}
	p.run(ctx, calls)
}

// run sends live as one pipeline, the writes waiting for replicas' acknowledgements
// where the store asks for them, and answers every call.
func (p *pipeliner) run(ctx context.Context, live []*call) {
	plain := live
	var replicated []*call
	if p.acks > 0 {
		plain = make([]*call, 0, len(live))
		for _, c := range live {
			if c.script.writes {
				replicated = append(replicated, c)
			} else {
				plain = append(plain, c)
			}
		}
	}
	if len(plain) > 0 {
		if retry := p.exec(ctx, plain, false); len(retry) > 0 {
			p.exec(ctx, retry, true)
		}
	}
	if len(replicated) > 0 {
		p.sendReplicated(ctx, replicated)
	}
}

// exec sends calls as one pipeline, EVALSHA or (full) EVAL, answers every call, and
// returns, when not full, those that met NOSCRIPT unanswered.
func (p *pipeliner) exec(ctx context.Context, calls []*call, full bool) (noScript []*call) {
	pipe := p.client.Pipeline()
	cmds := queueScripts(ctx, pipe, calls, full)
	_, _ = pipe.Exec(ctx)
	for i, c := range calls {
		val, err := cmds[i].Result()
		if !full && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			noScript = append(noScript, c)
			continue
		}
		c.finish(val, err)
	}
	return noScript
}

// queueScripts adds the calls' scripts to pipe, as EVALSHA or (full) EVAL.
func queueScripts(ctx context.Context, pipe redis.Pipeliner, calls []*call, full bool) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		if full {
			cmds[i] = c.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	return cmds
}
