package idem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// WithBatching turns the coalescing of concurrent calls on or off; it is on by default.
//
// With it on, a claim (that does not wait), complete, release or extend goes out at
// once when no batch of this client is in flight; calls made while one is gather and
// go out together as one POST /v1/batch when it returns. There is no timer, so a lone
// call waits for nothing, and under load one HTTP request carries many calls. Each
// call is answered exactly as it would be on its own. A daemon that has no batch
// endpoint (before contract 1.2.0) is detected on the first batch, and calls are sent
// one by one from then on.
func WithBatching(on bool) Option { return func(s *settings) { s.batching = on } }

// The bounds of one batch. A call larger than maxBatchItemBytes goes on its own, so
// that a batch stays far below any daemon's body limit (at least 64 KiB).
const (
	maxBatchItems     = 128
	maxBatchBytes     = 60 << 10
	maxBatchItemBytes = 16 << 10
)

// result is a call's answer: the status and the one answer member it carries, or err
// (a *Problem, or ErrUnavailable when no answer came).
type result struct {
	status   int
	acquired *idemapi.ClaimAcquired
	finished *idemapi.ClaimFinished
	record   *finishedRecord
	extended *idemapi.LeaseExtended
	err      error
}

// call is one operation on its way: alone, or in a batch.
type call struct {
	ctx context.Context
	// op is the item's one member, and body its request, encoded once for whichever
	// way the call goes.
	op   string
	body []byte
	res  result
	done chan struct{}
	// alone says that the call went as its own request, under its own context.
	alone atomic.Bool
}

// batcher gathers the calls of one Client. At most one batch is in flight: the
// goroutine that sends it takes what gathered meanwhile as the next one, and stops
// when nothing is left.
type batcher struct {
	c       *Client
	mu      sync.Mutex
	queue   []*call
	sending bool
	// unsupported is set once the daemon answered a batch as an unknown endpoint.
	unsupported atomic.Bool
}

// do runs one operation: through the batcher when it can share a request, on its own
// otherwise. ctx bounds the caller's wait; a call already sent in a batch may still
// take effect after the caller stopped waiting, as a call cut off on its own may.
//
// The item is encoded here and not kept, so that the requests that make it up need not
// outlive the caller's frame.
func (c *Client) do(ctx context.Context, item idemapi.BatchItem) result {
	op, body, err := encode(item)
	if err != nil {
		return result{err: err}
	}
	b := c.batches
	if b == nil || b.unsupported.Load() || (item.Claim != nil && item.Claim.WaitMs != nil) || len(body) > maxBatchItemBytes {
		return c.single(ctx, op, body)
	}
	cl := &call{ctx: ctx, op: op, body: body, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, cl)
	start := !b.sending
	b.sending = true
	b.mu.Unlock()
	if start {
		go b.run()
	}
	select {
	case <-cl.done:
		return cl.res
	case <-ctx.Done():
		if cl.alone.Load() {
			// Its own request ends with ctx; an answer that came before is decoded,
			// however long that takes (a claim that finds a large result), so that a
			// lease it acquired is not lost.
			<-cl.done
			return cl.res
		}
		return result{err: transportError(ctx.Err())}
	}
}

// run sends what gathered, batch after batch, until nothing is left.
func (b *batcher) run() {
	for {
		calls := b.next()
		if len(calls) == 0 {
			return
		}
		if len(calls) == 1 {
			// Alone: the call's own request, under its own context.
			cl := calls[0]
			cl.alone.Store(true)
			cl.res = b.c.single(cl.ctx, cl.op, cl.body)
			close(cl.done)
			continue
		}
		b.send(calls)
	}
}

// next takes the calls of the next batch off the queue, leaving out those whose
// caller has gone, or says that the sender is done.
func (b *batcher) next() []*call {
	b.mu.Lock()
	defer b.mu.Unlock()
	var calls []*call
	size := 0
	n := 0
	for ; n < len(b.queue) && len(calls) < maxBatchItems; n++ {
		cl := b.queue[n]
		if cl.ctx.Err() != nil {
			cl.res = result{err: transportError(cl.ctx.Err())}
			close(cl.done)
			continue
		}
		if size+cl.size() > maxBatchBytes && len(calls) > 0 {
			break
		}
		size += cl.size()
		calls = append(calls, cl)
	}
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	if len(calls) == 0 {
		b.sending = false
	}
	return calls
}

// send sends calls as one batch and answers each. A batch the daemon refuses as a
// whole (no batch endpoint, too large, not accepted as valid) is sent again call by
// call, so that every call gets the answer it would get on its own.
func (b *batcher) send(calls []*call) {
	size := len(`{"items":[]}`)
	for _, cl := range calls {
		size += cl.size()
	}
	var body bytes.Buffer
	body.Grow(size)
	body.WriteString(`{"items":[`)
	for i, cl := range calls {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteString(`{"`)
		body.WriteString(cl.op)
		body.WriteString(`":`)
		body.Write(cl.body)
		body.WriteByte('}')
	}
	body.WriteString(`]}`)

	// The batch is nobody's own call: one caller giving up must not cut it off for the
	// others, so it runs under the client's timeout alone.
	ctx, cancel := b.c.callContext(context.Background(), 0)
	defer cancel()
	results, resend, err := b.c.batch(ctx, body.Bytes(), len(calls))
	if resend {
		for _, cl := range calls {
			cl.res = b.c.single(cl.ctx, cl.op, cl.body)
			close(cl.done)
		}
		return
	}
	for i, cl := range calls {
		if err != nil {
			cl.res = result{err: err}
		} else {
			cl.res = fromBatch(results[i])
		}
		close(cl.done)
	}
}

// batch sends one POST /v1/batch of n items. resend says that the daemon refused the
// batch as a whole in a way its items alone would not be.
func (c *Client) batch(ctx context.Context, body []byte, n int) (results []batchItemResult, resend bool, err error) {
	resp, err := c.api.BatchWithBody(ctx, "application/json", bytes.NewReader(body), c.authorize)
	if err != nil {
		return nil, false, transportError(err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		// A daemon from before the batch endpoint.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		c.batches.unsupported.Store(true)
		return nil, true, nil
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, true, nil
	}
	var out batchResults
	if err := decode(resp, &out, http.StatusOK); err != nil {
		return nil, false, err
	}
	if len(out.Results) != n {
		return nil, false, fmt.Errorf("idem: a batch of %d calls was answered with %d results; is the base URL idemd's?", n, len(out.Results))
	}
	return out.Results, false, nil
}

// size is what the call adds to a batch's body: {"op":body} and a comma.
func (cl *call) size() int { return len(cl.op) + len(cl.body) + 6 }

// single sends one operation on its own: op and body are the item encoded (encode).
func (c *Client) single(ctx context.Context, op string, body []byte) result {
	send := c.api.ClaimWithBody
	switch op {
	case "complete":
		send = c.api.CompleteWithBody
	case "release":
		send = c.api.ReleaseWithBody
	case "extend":
		send = c.api.ExtendWithBody
	}
	resp, err := send(ctx, "application/json", bytes.NewReader(body), c.authorize)
	if err != nil {
		return result{err: transportError(err)}
	}
	r := result{status: resp.StatusCode}
	var out any
	switch {
	case op == "claim" && resp.StatusCode == http.StatusCreated:
		r.acquired = new(idemapi.ClaimAcquired)
		out = r.acquired
	case op == "claim" && resp.StatusCode == http.StatusOK:
		r.finished = new(idemapi.ClaimFinished)
		out = r.finished
	case (op == "complete" || op == "release") && resp.StatusCode == http.StatusOK:
		r.record = new(finishedRecord)
		out = r.record
	case op == "extend" && resp.StatusCode == http.StatusOK:
		r.extended = new(idemapi.LeaseExtended)
		out = r.extended
	}
	if out == nil {
		r.err = decode(resp, nil)
		return r
	}
	r.err = decode(resp, out, resp.StatusCode)
	return r
}

// batchResults is idemapi.BatchResults as the client reads it: the records of
// completes and releases without the members it has no use for.
type batchResults struct {
	Results []batchItemResult `json:"results"`
}

type batchItemResult struct {
	Acquired *idemapi.ClaimAcquired `json:"acquired,omitempty"`
	Extended *idemapi.LeaseExtended `json:"extended,omitempty"`
	Finished *idemapi.ClaimFinished `json:"finished,omitempty"`
	Problem  *idemapi.Problem       `json:"problem,omitempty"`
	Record   *finishedRecord        `json:"record,omitempty"`
	Status   int                    `json:"status"`
}

// finishedRecord is what the client reads of the record a complete or release
// answers: enough to put the result it stored into the replay cache. The stored
// response, which the client sent itself, is skipped rather than decoded again.
type finishedRecord struct {
	State       string    `json:"state"`
	Attempt     int64     `json:"attempt"`
	Fingerprint *string   `json:"fingerprint,omitempty"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// fromBatch is an item's result as the single call's would be.
func fromBatch(res batchItemResult) result {
	r := result{status: res.Status, acquired: res.Acquired, finished: res.Finished, record: res.Record, extended: res.Extended}
	if res.Status >= 300 || res.Problem != nil {
		p := &Problem{Status: res.Status, Title: http.StatusText(res.Status)}
		if w := res.Problem; w != nil {
			p.Type, p.Title, p.Code = w.Type, w.Title, w.Code
			if w.Detail != nil {
				p.Detail = *w.Detail
			}
			if w.RetryAfterMs != nil {
				p.RetryAfter = msDuration(*w.RetryAfterMs)
			}
		}
		r.err = p
	}
	return r
}
