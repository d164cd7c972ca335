package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// Options tune a Store. The zero value acknowledges a write once its master has it.
type Options struct {
	// ClientName is the name the store's connections give Redis (CLIENT SETNAME);
	// empty is DaemonClientName. OpenWith reads it; a Client made elsewhere keeps its
	// own.
	ClientName string
	// ReplicaAcks, when positive, makes every write wait until that many replicas of
	// the record's master confirm it (Redis WAIT on the connection that ran the
	// script), and fail with engine.ErrNotReplicated when they do not within
	// ReplicaTimeout.
	ReplicaAcks    int
	ReplicaTimeout time.Duration
	// Pipelines is how many pipelines may be in flight at once to each master
	// (DefaultPipelines when zero): a call that finds fewer goes out at once, alone;
	// calls that arrive while all are in flight wait and go out together in the next
	// one. A master whose pipelines all take long (a shortest round trip past 10 ms
	// lately, a distant Redis) gets once as many more for every 10 ms, up to eight
	// times as many.
	Pipelines int
	// Without Layout, the store writes records as strings at the keys of earlier
	// releases, as the release before this one does, which sees no other layout, and
	// reads strings and hashes there. The lean layout takes about half the memory;
	// moving to it takes three steps (docs/upgrading.md, "Upgrading"):
	//
	//   - LeanReady also reads records at their lean keys, for a rollout of LeanRecords
	//     beside it;
	//   - LeanRecords writes the lean layout, and reads both;
	//   - LeanOnly, with LeanRecords, stops looking at the earlier keys, once the
	//     longest retention has passed since the last daemon wrote there.
	//
	// Each look at the other key costs Redis a read for every new key (about a tenth of
	// its CPU per claim-and-complete cycle); the default and LeanOnly make none.
	// HashRecords writes hashes, the layout of the releases before the previous one.
	LeanReady   bool
	LeanRecords bool
	LeanOnly    bool
	HashRecords bool
	// Layout, when set, takes the place of the four fields above: the store agrees
	// it with the other daemons of its Redis through the layout key before its first
	// call (Store.AgreeLayout), and LayoutAuto lets the key, or what the Redis holds,
	// choose it.
	Layout Layout
	// Logger receives the line that says which layout the store agreed and why
	// (slog.Default() when nil).
	Logger *slog.Logger
}

// DefaultReplicaTimeout is ReplicaTimeout when ReplicaAcks is set and it is not.
const DefaultReplicaTimeout = 250 * time.Millisecond

// sendReplicated sends writes that wait for replica acknowledgements: one pipeline per
// master (concurrently on a Cluster), the scripts then one WAIT, on one connection of
// that master. WAIT counts the replicas that have every write made before it on its
// connection, so one WAIT answers for the whole pipeline. A Cluster slot that moved
// since the client last looked is retried once with a fresh slot map; anything else is
// unavailable.
func (p *pipeliner) sendReplicated(ctx context.Context, calls []*call) {
	for attempt := 0; len(calls) > 0; attempt++ {
		groups := make(map[*redis.Client][]*call)
		for _, c := range calls {
			node, err := p.client.MasterFor(ctx, c.keys[0])
			if err != nil {
				c.finish(nil, err)
				continue
			}
			groups[node] = append(groups[node], c)
		}
		var moved []*call
		if len(groups) == 1 {
			for node, group := range groups {
				moved = p.evalAndWait(ctx, node, group)
			}
		} else {
			var mu sync.Mutex
			var wg sync.WaitGroup
			for node, group := range groups {
				wg.Add(1)
				go func() {
					defer wg.Done()
					m := p.evalAndWait(ctx, node, group)
					mu.Lock()
					moved = append(moved, m...)
					mu.Unlock()
				}()
			}
			wg.Wait()
		}
		if attempt > 0 {
			for _, c := range moved {
				c.finish(nil, c.err)
			}
			return
		}
		if len(moved) > 0 {
			p.client.ReloadSlots(ctx)
		}
		calls = moved
	}
}

// evalAndWait runs calls, all on node's slots, as EVALSHA then WAIT, and those that
// answer NOSCRIPT again as EVAL then WAIT. It answers every call but those whose slot
// moved (MOVED, ASK), which it returns with their error in err.
func (p *pipeliner) evalAndWait(ctx context.Context, node *redis.Client, calls []*call) (moved []*call) {
	for _, full := range []bool{false, true} {
		pipe := node.Pipeline()
		cmds := queueScripts(ctx, pipe, calls, full)
		wait := pipe.Do(ctx, "WAIT", p.acks, p.ackTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		acked, waitErr := wait.Int64()
		var noScript []*call
		for i, c := range calls {
			val, err := cmds[i].Result()
			switch {
			case !full && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
				noScript = append(noScript, c)
			case err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")):
				c.err = err
				moved = append(moved, c)
			case err != nil:
				c.finish(nil, err)
			case waitErr != nil:
				c.finish(nil, waitErr)
			case acked < int64(p.acks):
				c.finish(nil, &notReplicatedError{acked: acked, want: p.acks})
			default:
				c.finish(val, nil)
			}
		}
		if len(noScript) == 0 {
			break
		}
		calls = noScript
	}
	return moved
}

type notReplicatedError struct {
	acked int64
	want  int
}

func (e *notReplicatedError) Error() string {
	return fmt.Sprintf("%d of %d replicas confirmed the write in time", e.acked, e.want)
}

func (e *notReplicatedError) Unwrap() error { return engine.ErrNotReplicated }

// EvictionPolicies reads maxmemory-policy on every master and returns those that are
// not noeviction, by address. Eviction silently forgets records, pending leases
// included, so idemd warns about (or refuses) anything else.
func (s *Store) EvictionPolicies(ctx context.Context) (map[string]string, error) {
	bad := make(map[string]string)
	check := func(ctx context.Context, c *redis.Client) error {
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return fmt.Errorf("CONFIG GET maxmemory-policy on %s: %w", c.Options().Addr, err)
		}
		if p := v["maxmemory-policy"]; p != "noeviction" {
			bad[c.Options().Addr] = p
		}
		return nil
	}
	// ForEachMaster may run concurrently; one at a time keeps bad simple.
	var mu sync.Mutex
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return check(ctx, m)
	})
	return bad, err
}
