package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// Options tune a Store. The zero value acknowledges a write once its master has it.
type Options struct {
	// ReplicaAcks, when positive, makes every write wait until that many replicas of
	// the record's master confirm it (Redis WAIT on the connection that ran the
	// script), and fail with engine.ErrNotReplicated when they do not within
	// ReplicaTimeout.
	ReplicaAcks    int
	ReplicaTimeout time.Duration
	// Pipelines is how many pipelines may be in flight at once (DefaultPipelines
	// when zero): calls that arrive while all are in flight wait and go out
	// together in the next one.
	Pipelines int
}

// DefaultReplicaTimeout is ReplicaTimeout when ReplicaAcks is set and it is not.
const DefaultReplicaTimeout = 250 * time.Millisecond

// runReplicated runs a write script and WAIT in one pipeline on one connection of the
// key's master, so that WAIT counts the replicas that have this very write. A Cluster
// slot that moved since the client last looked is retried once with a fresh slot map;
// anything else is unavailable.
func (s *Store) runReplicated(ctx context.Context, script script, key string, args []any) (any, error) {
	for attempt := 0; ; attempt++ {
		node, err := s.client.MasterFor(ctx, key)
		if err != nil {
			return nil, err
		}
		v, err := s.evalAndWait(ctx, node, script, key, args, false)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = s.evalAndWait(ctx, node, script, key, args, true)
		}
		if err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")) && attempt == 0 {
			s.client.ReloadSlots(ctx)
			continue
		}
		return v, err
	}
}

func (s *Store) evalAndWait(ctx context.Context, node *redis.Client, script script, key string, args []any, full bool) (any, error) {
	pipe := node.Pipeline()
	var run *redis.Cmd
	if full {
		run = script.Eval(ctx, pipe, []string{key}, args...)
	} else {
		run = script.EvalSha(ctx, pipe, []string{key}, args...)
	}
	wait := pipe.Do(ctx, "WAIT", s.opts.ReplicaAcks, s.opts.ReplicaTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	v, err := run.Result()
	if err != nil {
		return nil, err
	}
	acked, err := wait.Int64()
	if err != nil {
		return nil, err
	}
	if acked < int64(s.opts.ReplicaAcks) {
		return nil, &notReplicatedError{acked: acked, want: s.opts.ReplicaAcks}
	}
	return v, nil
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
