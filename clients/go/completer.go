package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// CompleterOptions configure a Completer. Prefix (or AllKeys) and Handler are
// required; the zero value of every other field is its default.
type CompleterOptions struct {
	// Prefix selects the keys the completer finishes: those that begin with it, for
	// example the WithKeyPrefix of a middleware, or the keys a service gives Do for
	// one kind of work. One handler finishes them all, so they must be work of one
	// kind.
	Prefix string
	// AllKeys lets Prefix be "" and the completer take every abandoned key of the
	// tenant. It is a flag of its own so that a prefix left empty by mistake is an
	// error rather than a completer that runs its handler on every other kind of work.
	AllKeys bool
	// OlderThan leaves alone the keys whose lease ran out less than this long ago, for
	// example to give their own callers time to retry first. The default is 0.
	OlderThan time.Duration
	// Concurrency bounds the handlers that run at once; the default is 4.
	Concurrency int
	// Lease is the lease each handler runs under, renewed while it runs, as
	// DoOptions.Lease (default 30 s; 100 ms to 1 h). It is also how long a key whose
	// handler failed waits before it is listed again.
	Lease time.Duration
	// PollInterval is how long Run waits before the next pass once a pass finished
	// nothing; the default is 5 s.
	PollInterval time.Duration
	// Handler finishes, or compensates, the work of one abandoned key. It is called
	// as the function given to Do is: LeaseFrom(ctx) gives its lease, with the key,
	// Recovered true when the key was taken over from a holder whose lease ran out
	// (the usual case), the Attempt, and the RecoveryPoint that holder recorded, if
	// any. Its Response is stored as the key's result, which the key's own callers
	// then get back; a PermanentError stores a failure; any other error leaves the key
	// pending, to be listed again once the lease runs out. It may record progress with
	// the lease's Checkpoint.
	Handler func(ctx context.Context) (Response, error)
	// OnError, if set, is called with every error the completer meets and does not
	// return: a key whose handler failed or whose result could not be stored (key
	// set), and in Run a pass that could not read the feed (key "").
	OnError func(key string, err error)
}

// CompleterStats counts what one pass did with the keys it listed: Listed is
// Finished + Failed + Skipped + Errors.
type CompleterStats struct {
	// Listed is the keys the pass took from the feed.
	Listed int
	// Finished is the keys whose handler ran and whose result is stored.
	Finished int
	// Failed is the keys whose handler returned a PermanentError, stored as the key's
	// failure.
	Failed int
	// Skipped is the keys the pass did not run: another caller or completer holds the
	// key, or it was finished since the feed listed it.
	Skipped int
	// Errors is the keys whose handler failed or that could not be claimed or
	// finished; they stay pending and are listed again once their lease runs out.
	Errors int
}

// Completer finishes the work that holders left: it reads the abandoned-keys feed
// (Client.Abandoned) under a prefix and runs its handler for each key, as Do would
// for a caller that retries, with the fingerprint the feed shows. The claim decides
// who finishes a key, so any number of completers, in any number of processes, and
// the keys' own callers may run at once: a key another one holds is skipped, a key
// already finished is replayed and skipped, and no handler runs for a key twice
// unless a lease is lost (see Lease).
//
// A handler that fails does not free the key for a retry as Do would: a key released
// is no longer pending and would drop out of the feed the completer works from. It
// stays pending, and the feed lists it again once its lease runs out.
//
// On a client made WithSealing, the handler's lease carries the recovery point opened,
// and the result it returns is stored sealed. A key whose point does not open (a key
// the ring does not hold) runs no handler: it goes to OnError, as an error matching
// ErrUnsealable, and stays pending.
type Completer struct {
	c *Client
	o CompleterOptions
}

// NewCompleter returns a completer of the keys that opts select, on c. It refuses
// options without a Handler, without a Prefix unless AllKeys is set, with a prefix
// that is over 255 bytes or not valid UTF-8, or with a negative duration, a
// negative Concurrency or a Lease outside 100 ms to 1 h.
func NewCompleter(c *Client, opts CompleterOptions) (*Completer, error) {
	switch {
	case c == nil:
		return nil, errors.New("idem.NewCompleter: no client")
	case opts.Handler == nil:
		return nil, errors.New("idem.NewCompleter: a Handler is required")
	case opts.Prefix == "" && !opts.AllKeys:
		return nil, errors.New("idem.NewCompleter: a Prefix is required; set AllKeys to finish every abandoned key with one handler")
	case opts.Prefix != "" && opts.AllKeys:
		return nil, errors.New("idem.NewCompleter: AllKeys with a Prefix: choose one")
	case len(opts.Prefix) > maxKeyBytes || !utf8.ValidString(opts.Prefix):
		return nil, fmt.Errorf("idem.NewCompleter: the Prefix must be valid UTF-8 of at most %d bytes", maxKeyBytes)
	case opts.OlderThan < 0 || opts.PollInterval < 0 || opts.Concurrency < 0:
		return nil, errors.New("idem.NewCompleter: OlderThan, PollInterval and Concurrency cannot be negative")
	case opts.Lease != 0 && (opts.Lease < minLease || opts.Lease > maxLease):
		return nil, fmt.Errorf("idem.NewCompleter: Lease %s: idemd's leases last %s to %s", opts.Lease, minLease, maxLease)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 4
	}
	if opts.Lease == 0 {
		opts.Lease = 30 * time.Second
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Second
	}
	return &Completer{c: c, o: opts}, nil
}

// RunOnce makes one pass over the feed, every page of it, and returns once the
// handlers it started have returned. It returns an error when the feed could not be
// read to its end (the keys listed until then were run) or ctx ended; a key that
// could not be finished is counted in Errors, and reported to OnError, instead. When
// ctx ends, no more keys are taken, and the contexts of the handlers that run are
// cancelled, since they derive from ctx. RunOnce may be called from several
// goroutines, and alongside Run.
func (cp *Completer) RunOnce(ctx context.Context) (CompleterStats, error) {
	var (
		mu    sync.Mutex
		stats CompleterStats
		wg    sync.WaitGroup
	)
	keys := make(chan AbandonedKey)
	for range cp.o.Concurrency {
		wg.Go(func() {
			for k := range keys {
				outcome := cp.finish(ctx, k)
				mu.Lock()
				switch outcome {
				case keyFinished:
					stats.Finished++
				case keyFailed:
					stats.Failed++
				case keySkipped:
					stats.Skipped++
				default:
					stats.Errors++
				}
				mu.Unlock()
			}
		})
	}
	listed, err := cp.pass(ctx, keys, func(string) bool { return true })
	close(keys)
	wg.Wait()
	stats.Listed = listed
	if err == nil {
		err = ctx.Err()
	}
	return stats, err
}

// pass reads every page of the feed and hands each key that take accepts to the
// workers, once in the pass. It returns how many it handed out.
func (cp *Completer) pass(ctx context.Context, keys chan<- AbandonedKey, take func(key string) bool) (int, error) {
	seen := make(map[string]bool)
	handed := 0
	for k, err := range cp.c.AbandonedKeys(ctx, AbandonedOptions{Prefix: cp.o.Prefix, OlderThan: cp.o.OlderThan}) {
		if err != nil {
			return handed, err
		}
		if seen[k.Key] {
			// A page read later may list again a key that was given up meanwhile; one
			// run a pass is enough.
			continue
		}
		seen[k.Key] = true
		if ctx.Err() != nil {
			return handed, ctx.Err()
		}
		if !take(k.Key) {
			continue
		}
		select {
		case keys <- k:
			handed++
		case <-ctx.Done():
			return handed, ctx.Err()
		}
	}
	return handed, nil
}

// keyOutcome is what became of one key a completer took.
type keyOutcome int

const (
	keyFinished keyOutcome = iota
	keyFailed
	keySkipped
	keyError
)

// finish runs the handler for k by Do's run path, and says how it went. A key that
// could not be finished goes to OnError.
func (cp *Completer) finish(ctx context.Context, k AbandonedKey) keyOutcome {
	var ran bool
	var handlerErr error
	res, err := cp.c.claimAndRun(ctx, k.Key, k.Fingerprint, func(ctx context.Context) (Response, error) {
		ran = true
		r, err := cp.o.Handler(ctx)
		handlerErr = err
		return r, err
	}, DoOptions{Lease: cp.o.Lease}, leavePending)
	var perm *PermanentError
	switch {
	case !ran && ((err == nil && res.Replayed) || errors.Is(err, ErrFailed) || errors.Is(err, ErrInProgress)):
		// Another holder has the key, or it was finished since the feed listed it.
		return keySkipped
	case ran && err == nil:
		return keyFinished
	case ran && err == handlerErr && errors.As(err, &perm):
		// The failure is stored: the claim handed back the handler's own error.
		return keyFailed
	}
	if cp.o.OnError != nil {
		cp.o.OnError(k.Key, fmt.Errorf("idem: completing %q: %w", k.Key, err))
	}
	return keyError
}

// Run keeps finishing abandoned keys until ctx ends, and then returns nil. Its
// Concurrency workers outlive the passes over the feed: a pass hands them the keys
// that are not running already, so a handler that takes long holds up no other key.
// After a pass during which a key was finished or failed, the next starts at once,
// for more may be waiting; otherwise it starts PollInterval later. While idemd cannot
// be reached (ErrUnavailable, 429, 5xx) the passes come further and further apart,
// from 250 ms doubling up to 30 s with jitter; each failed pass goes to OnError, and
// Run never returns for one. A feed that idemd refuses otherwise (401, 403, 400) is a
// mistake that no retry mends: Run returns that error, once its handlers returned.
//
// When ctx ends Run takes no more keys, and the handlers that run have their context
// cancelled (it derives from ctx); Run returns once they have all returned. A handler
// that returns a result anyway has it stored; one that returns the context's error
// leaves its key pending for the next completer.
func (cp *Completer) Run(ctx context.Context) error {
	var (
		mu       sync.Mutex
		running  = make(map[string]bool)
		progress atomic.Int64
		wg       sync.WaitGroup
	)
	keys := make(chan AbandonedKey)
	defer func() {
		close(keys)
		wg.Wait()
	}()
	for range cp.o.Concurrency {
		wg.Go(func() {
			for k := range keys {
				if o := cp.finish(ctx, k); o == keyFinished || o == keyFailed {
					progress.Add(1)
				}
				mu.Lock()
				delete(running, k.Key)
				mu.Unlock()
			}
		})
	}
	take := func(key string) bool {
		mu.Lock()
		defer mu.Unlock()
		if running[key] {
			return false
		}
		running[key] = true
		return true
	}

	var backoff time.Duration
	for {
		before := progress.Load()
		_, err := cp.pass(ctx, keys, take)
		if ctx.Err() != nil {
			return nil
		}
		wait := cp.o.PollInterval
		switch {
		case err != nil && passAgain(err):
			backoff = min(max(2*backoff, 250*time.Millisecond), 30*time.Second)
			wait = backoff/2 + rand.N(backoff-backoff/2+1)
			var p *Problem
			if errors.As(err, &p) && p.RetryAfter > wait {
				wait = p.RetryAfter
			}
			if cp.o.OnError != nil {
				cp.o.OnError("", err)
			}
		case err != nil:
			return err
		case progress.Load() > before:
			backoff = 0
			continue
		default:
			backoff = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// passAgain tells a pass that failed because idemd could not answer, or not now,
// from one it refused.
func passAgain(err error) bool {
	var p *Problem
	switch {
	case errors.Is(err, ErrUnavailable):
		return true
	case errors.As(err, &p):
		return p.Status == http.StatusTooManyRequests || p.Status >= 500
	}
	return false
}
