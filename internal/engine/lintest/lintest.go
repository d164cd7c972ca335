// Package lintest checks that a store is linearizable: many clients run claims,
// completions and releases concurrently on a few keys, every call is recorded with
// when it was invoked and when it answered, and porcupine searches for an order of
// the calls, consistent with those times, in which a model of the state machine gives
// every answer that was observed.
package lintest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemd/idemd/internal/engine"
)

// Config says how much concurrency to record.
type Config struct {
	Clients      int
	Keys         int
	OpsPerClient int
	// During, when set, runs once when half of the operations are done (to kill a
	// node, say), while the clients go on.
	During func()
}

// Op is a call the model knows.
type Op string

// The calls.
const (
	OpClaim    Op = "claim"
	OpComplete Op = "complete"
	OpRelease  Op = "release"
	// OpLookup reads a key's state, which it answers as OutNotFound, OutPending,
	// OutReleased or OutCompleted.
	OpLookup Op = "lookup"
)

type input struct {
	op    Op
	key   string
	token string
}

// The outputs; OutUnknown is a call that failed without an answer from the store (it
// may or may not have taken effect).
const (
	OutAcquired   = "acquired"
	OutInProgress = "in_progress"
	OutCompleted  = "completed"
	OutOK         = "ok"
	OutLeaseLost  = "lease_lost"
	OutNotFound   = "not_found"
	OutUnknown    = "unknown"
	OutPending    = "pending"
	OutReleased   = "released"
)

// state is one key's record as the model sees it: no expiry (leases are long) and
// no fingerprints.
type state struct {
	st  byte // 0 absent, 'p' pending, 'r' released, 'c' completed
	tok string
}

// step is the state machine of lua/*.lua and the bolt store, for the calls recorded.
// Run makes no lookups; histories recorded elsewhere may end with them, to find what
// was lost.
func step(s state, in input) (string, state) {
	switch in.op {
	case OpClaim:
		switch {
		case s.st == 0 || s.st == 'r':
			return OutAcquired, state{'p', in.token}
		case s.st == 'p' && s.tok == in.token:
			return OutAcquired, s
		case s.st == 'p':
			return OutInProgress, s
		default:
			return OutCompleted, s
		}
	case OpComplete:
		switch {
		case s.st == 0:
			return OutNotFound, s
		case s.tok != in.token:
			return OutLeaseLost, s
		case s.st == 'p':
			return OutOK, state{'c', s.tok}
		case s.st == 'c':
			return OutOK, s
		default:
			return OutLeaseLost, s
		}
	case OpRelease:
		switch {
		case s.st == 0:
			return OutNotFound, s
		case s.tok != in.token:
			return OutLeaseLost, s
		case s.st == 'p':
			return OutOK, state{'r', s.tok}
		case s.st == 'r':
			return OutOK, s
		default:
			return OutLeaseLost, s
		}
	case OpLookup:
		return map[byte]string{0: OutNotFound, 'p': OutPending, 'r': OutReleased, 'c': OutCompleted}[s.st], s
	}
	panic("unknown operation " + in.op)
}

// Model is the porcupine model: partitioned by key, and nondeterministic for calls of
// unknown outcome, which may or may not have happened.
var Model = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(input).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{state{}} },
	Step: func(st, in, out any) []any {
		s, i, o := st.(state), in.(input), out.(string)
		want, next := step(s, i)
		switch {
		case o == OutUnknown && next != s:
			return []any{s, next}
		case o == OutUnknown, o == want:
			return []any{next}
		}
		return nil
	},
	DescribeOperation: func(in, out any) string {
		i := in.(input)
		return fmt.Sprintf("%s(%s, %.6s) -> %s", i.op, i.key, i.token, out)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		if s.st == 0 {
			return "absent"
		}
		return fmt.Sprintf("%c %.6s", s.st, s.tok)
	},
}).ToModel()

// History is the calls one Run recorded.
type History struct {
	Ops     []porcupine.Operation
	Unknown int
}

// Call is one call recorded outside Run, by another process say. Start and End come
// from one clock that every recorder shares (CLOCK_MONOTONIC across the processes of
// one machine). Token is the lease token the claim acquired, or that the completion or
// release sent; a claim of unknown outcome may leave it empty.
type Call struct {
	Client int    `json:"client"`
	Op     Op     `json:"op"`
	Key    string `json:"key"`
	Token  string `json:"token,omitempty"`
	Out    string `json:"out"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
}

// FromCalls makes a History of calls recorded elsewhere.
func FromCalls(calls []Call) (History, error) {
	var h History
	h.Ops = make([]porcupine.Operation, 0, len(calls))
	for i, c := range calls {
		switch c.Op {
		case OpClaim, OpComplete, OpRelease, OpLookup:
		default:
			return History{}, fmt.Errorf("call %d: unknown operation %q", i, c.Op)
		}
		switch c.Out {
		case OutAcquired, OutInProgress, OutCompleted, OutOK, OutLeaseLost, OutNotFound, OutUnknown, OutPending, OutReleased:
		default:
			return History{}, fmt.Errorf("call %d: unknown output %q", i, c.Out)
		}
		if c.End < c.Start {
			return History{}, fmt.Errorf("call %d: answered at %d, before its call at %d", i, c.End, c.Start)
		}
		op := porcupine.Operation{ClientId: c.Client, Input: input{c.Op, c.Key, c.Token}, Call: c.Start, Output: c.Out, Return: c.End}
		if c.Out == OutUnknown {
			op.Return = math.MaxInt64 / 2
			h.Unknown++
			if c.Op == OpClaim && c.Token == "" {
				// A lease nobody learned: no later call can name it.
				op.Input = input{c.Op, c.Key, fmt.Sprintf("unlearned-%d", i)}
			}
		}
		h.Ops = append(h.Ops, op)
	}
	return h, nil
}

// Run has cfg.Clients clients call s concurrently and records every call.
func Run(t testing.TB, s engine.Store, cfg Config) History {
	t.Helper()
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	prefix := fmt.Sprintf("lin-%d", time.Now().UnixNano())
	var (
		mu    sync.Mutex
		h     History
		done  int
		fired sync.Once
		wg    sync.WaitGroup
		total = cfg.Clients * cfg.OpsPerClient
	)
	for c := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), uint64(start.UnixNano())))
			held := map[string]string{} // key -> a token this client acquired
			var last engine.Claim       // the last claim, resent now and then
			for range cfg.OpsPerClient {
				key := fmt.Sprintf("%s-%d", prefix, rng.IntN(cfg.Keys))
				id := engine.ID{Tenant: engine.DefaultTenant, Key: key}
				var in input
				var out string
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				call := now()
				switch r := rng.IntN(10); {
				case r < 4 || len(held) == 0:
					c := engine.Claim{ID: id, Lease: time.Hour, Retention: time.Hour, Token: engine.NewLeaseToken()}
					if r == 0 && last.Token != "" {
						c = last // a resent claim
					}
					in = input{OpClaim, c.ID.Key, c.Token}
					res, err := s.Claim(ctx, c)
					switch {
					case err == nil && res.Outcome == engine.OutcomeAcquired:
						out = OutAcquired
						held[c.ID.Key] = c.Token
					case err == nil:
						out = string(res.Outcome)
					case errors.Is(err, engine.ErrInProgress):
						out = OutInProgress
					default:
						out = OutUnknown
						held[c.ID.Key] = c.Token // it may have acquired
					}
					last = c
				default:
					k, tok := pick(rng, held)
					id.Key = k
					var err error
					if r < 7 {
						in = input{OpComplete, k, tok}
						_, err = s.Complete(ctx, engine.Completion{ID: id, LeaseToken: tok, Retention: time.Hour,
							Response: engine.Response{Status: 200, Body: []byte(tok)}})
					} else {
						in = input{OpRelease, k, tok}
						_, err = s.Release(ctx, engine.Release{ID: id, LeaseToken: tok, Mode: engine.ReleaseRetry, Retention: time.Hour})
					}
					switch {
					case err == nil:
						out = OutOK
					case errors.Is(err, engine.ErrLeaseLost):
						out = OutLeaseLost
					case errors.Is(err, engine.ErrNotFound):
						out = OutNotFound
					default:
						out = OutUnknown
					}
					if rng.IntN(3) == 0 {
						delete(held, k)
					}
				}
				ret := now()
				cancel()
				op := porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
				mu.Lock()
				if out == OutUnknown {
					// Its effect, if any, may land at any time after the call.
					op.Return = math.MaxInt64 / 2
					h.Unknown++
				}
				h.Ops = append(h.Ops, op)
				done++
				half := done == total/2
				mu.Unlock()
				if half && cfg.During != nil {
					fired.Do(cfg.During)
				}
			}
		}()
	}
	wg.Wait()
	return h
}

func pick(rng *rand.Rand, held map[string]string) (string, string) {
	i := rng.IntN(len(held))
	for k, tok := range held {
		if i == 0 {
			return k, tok
		}
		i--
	}
	panic("unreachable")
}

// Check runs porcupine on the history. When the history is not linearizable it
// writes the visualisation to IDEMD_LINEARIZABILITY_DIR (or the test's temporary
// directory) and logs where.
func (h History) Check(t testing.TB, name string) porcupine.CheckResult {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(Model, h.Ops, 60*time.Second)
	if res != porcupine.Ok {
		dir := os.Getenv("IDEMD_LINEARIZABILITY_DIR")
		if dir == "" {
			dir = t.TempDir()
		}
		path := filepath.Join(dir, name+".html")
		if err := porcupine.VisualizePath(Model, info, path); err != nil {
			t.Logf("writing the visualisation: %v", err)
		} else {
			t.Logf("history %s is %s; visualisation in %s", name, res, path)
		}
	}
	return res
}
