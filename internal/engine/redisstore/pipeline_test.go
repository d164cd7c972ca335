package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/netsplit"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// gate is a go-redis hook that holds every pipeline of scripts until it is opened, so
// that a test can fill the store's queue while its workers are busy, and counts the
// scripts that go to Redis alone and in pipelines.
type gate struct {
	open chan struct{}

	mu          sync.Mutex
	held        int // pipelines waiting for the gate
	heldScripts int // scripts in them
	pipelines   int // pipelines of EVALSHA; those that send NOSCRIPT calls again with EVAL are not counted
	evalsha     int // EVALSHA in pipelines
	eval        int // EVAL in pipelines
	noScript    int // EVALSHA in pipelines answered NOSCRIPT
	waits       int // WAIT in pipelines
	single      int // scripts sent alone
	flying      int // pipelines past the gate and not yet answered
	mostFlying  int // the most there were at once
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			g.mu.Lock()
			g.single++
			g.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || (cmds[0].Name() != "evalsha" && cmds[0].Name() != "eval") {
			// go-redis's own, such as the handshake of a new connection.
			return next(ctx, cmds)
		}
		g.mu.Lock()
		if len(cmds) > 0 && cmds[0].Name() == "evalsha" {
			g.pipelines++
		}
		g.held++
		g.heldScripts += len(cmds)
		g.mu.Unlock()
		<-g.open
		g.mu.Lock()
		g.held--
		g.heldScripts -= len(cmds)
		g.flying++
		g.mostFlying = max(g.mostFlying, g.flying)
		g.mu.Unlock()
		err := next(ctx, cmds)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.flying--
		for _, cmd := range cmds {
			switch cmd.Name() {
			case "evalsha":
				g.evalsha++
				if cmd.Err() != nil && strings.HasPrefix(cmd.Err().Error(), "NOSCRIPT") {
					g.noScript++
				}
			case "eval":
				g.eval++
			case "wait":
				g.waits++
			}
		}
		return err
	}
}

// holding reports whether n pipelines wait at the gate.
func (g *gate) holding(n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held == n
}

func (g *gate) counts() gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	return gate{pipelines: g.pipelines, evalsha: g.evalsha, eval: g.eval, noScript: g.noScript, waits: g.waits, single: g.single,
		held: g.held, heldScripts: g.heldScripts, mostFlying: g.mostFlying}
}

// gatedStore opens a store on srv with that many pipelines whose client passes
// through a new gate.
func gatedStore(t *testing.T, srv *testredis.Server, pipelines int) (*redisstore.Store, *gate) {
	t.Helper()
	return gatedStoreWith(t, srv, redisstore.Options{Pipelines: pipelines})
}

func gatedStoreWith(t *testing.T, srv *testredis.Server, opts redisstore.Options) (*redisstore.Store, *gate) {
	t.Helper()
	return gatedStoreAt(t, srv.URL(), opts)
}

func gatedStoreAt(t *testing.T, url string, opts redisstore.Options) (*redisstore.Store, *gate) {
	t.Helper()
	universal, err := redisstore.NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	universal.AddHook(g)
	client, err := redisstore.Adapt(universal)
	if err != nil {
		t.Fatal(err)
	}
	s := redisstore.New(client, opts)
	t.Cleanup(func() {
		select {
		case <-g.open:
		default:
			close(g.open)
		}
		_ = s.Close()
	})
	return s, g
}

func claim(key string) engine.Claim {
	return engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: key}, Lease: time.Minute,
		Retention: time.Hour, Token: engine.NewLeaseToken()}
}

// claimAll claims n fresh keys concurrently and returns their errors, in order, once
// every claim has answered.
func claimAll(ctx context.Context, s *redisstore.Store, prefix string, n int) <-chan []error {
	out := make(chan []error, 1)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Claim(ctx, claim(fmt.Sprintf("%s-%d", prefix, i)))
			if err == nil && res.Outcome != engine.OutcomeAcquired {
				err = fmt.Errorf("outcome %v, want acquired", res.Outcome)
			}
			errs[i] = err
		}()
	}
	go func() {
		wg.Wait()
		out <- errs
	}()
	return out
}

// answer waits for a result from ch, failing the test if none comes in a minute.
func answer[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait.Scale(time.Minute)):
		t.Fatalf("no answer from %s in a minute", what)
		panic("unreachable")
	}
}

// TestPipelining: calls that arrive while every pipeline is in flight go to Redis
// together in the next one, not one round trip each.
func TestPipelining(t *testing.T) {
	t.Parallel()
	const calls = 40
	s, g := gatedStore(t, testredis.Start(t), 2)
	done := claimAll(t.Context(), s, "shared", calls)
	// Each call is in a pipeline at the gate or queued, and no worker is idle while
	// calls are queued.
	wait.For(t, 30*time.Second, "every call at the gate or queued", func() bool {
		c, queued := g.counts(), s.Queued()
		return c.heldScripts+queued == calls && (c.held == 2 || queued == 0)
	})
	close(g.open)
	for i, err := range answer(t, done, "the claims") {
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
	}
	c := g.counts()
	// The held pipelines, then the worker's with every call queued meanwhile. The
	// fresh Redis knows no script yet: some calls answer NOSCRIPT and go again with
	// EVAL.
	if c.pipelines > 4 || c.evalsha != calls || c.single != 0 || c.eval != c.noScript {
		t.Fatalf("%d claims went out in %d pipelines (%d scripts in them, %d alone; %d NOSCRIPT, %d EVAL), want at most 4 pipelines carrying all",
			calls, c.pipelines, c.evalsha, c.single, c.noScript, c.eval)
	}
}

// TestPipelineNoScript: when Redis has forgotten the scripts (a restart, SCRIPT
// FLUSH), every call of a pipeline that answers NOSCRIPT is sent again with EVAL and
// succeeds.
func TestPipelineNoScript(t *testing.T) {
	t.Parallel()
	const calls = 20
	srv := testredis.Start(t)
	s, g := gatedStore(t, srv, 1)
	close(g.open)
	if _, err := s.Claim(t.Context(), claim("loads-the-script")); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Command("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	before := g.counts()
	for i, err := range answer(t, claimAll(t.Context(), s, "flushed", calls), "the claims") {
		if err != nil {
			t.Errorf("claim %d after SCRIPT FLUSH: %v", i, err)
		}
	}
	c := g.counts()
	noScript, eval := c.noScript-before.noScript, c.eval-before.eval
	if noScript == 0 || eval != noScript {
		t.Fatalf("after SCRIPT FLUSH: %d calls answered NOSCRIPT and %d were sent again with EVAL, want as many, more than none",
			noScript, eval)
	}
	for i := range calls {
		rec, err := s.Lookup(t.Context(), engine.ID{Tenant: engine.DefaultTenant, Key: fmt.Sprintf("flushed-%d", i)})
		if err != nil || rec.State != engine.StatePending {
			t.Fatalf("record %d after its claim: %v %v", i, rec.State, err)
		}
	}
}

// TestPipelineCallerLeaves: a caller whose context ends while its call waits for a
// pipeline gets its context's error at once, its script is never sent, and the calls
// that were to share its pipeline are answered as usual.
func TestPipelineCallerLeaves(t *testing.T) {
	t.Parallel()
	s, g := gatedStore(t, testredis.Start(t), 1)
	busy := claimAll(t.Context(), s, "busy", 1)
	wait.For(t, 30*time.Second, "the one pipeline at the gate", func() bool { return g.holding(1) })

	leaving, leave := context.WithCancel(t.Context())
	left := make(chan error, 1)
	go func() {
		_, err := s.Claim(leaving, claim("left"))
		left <- err
	}()
	others := claimAll(t.Context(), s, "stayed", 2)
	wait.For(t, 30*time.Second, "three calls queued", func() bool { return s.Queued() == 3 })
	leave()
	if err := answer(t, left, "the caller that left"); !errors.Is(err, context.Canceled) || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("a caller that left while queued: %v, want its context's error, not unavailable", err)
	}

	close(g.open)
	for i, err := range append(answer(t, busy, "the held claim"), answer(t, others, "the other claims")...) {
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
	}
	if _, err := s.Lookup(t.Context(), engine.ID{Tenant: engine.DefaultTenant, Key: "left"}); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("the claim of the caller that left: lookup %v, want not found (never sent)", err)
	}
	if c := g.counts(); c.evalsha != 3+1 { // the three claims, then the lookup
		t.Fatalf("%d scripts went to Redis, want 4", c.evalsha)
	}
}

// TestPipelineClose: Close answers the queued calls unavailable at once, returns once
// the pipeline in flight has its answer, and calls after it are unavailable.
func TestPipelineClose(t *testing.T) {
	t.Parallel()
	s, g := gatedStore(t, testredis.Start(t), 1)
	inFlight := claimAll(t.Context(), s, "in-flight", 1)
	wait.For(t, 30*time.Second, "the one pipeline at the gate", func() bool { return g.holding(1) })
	queued := claimAll(t.Context(), s, "queued", 3)
	wait.For(t, 30*time.Second, "three calls queued", func() bool { return s.Queued() == 3 })

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	for i, err := range answer(t, queued, "the queued claims") {
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("queued claim %d at Close: %v, want unavailable", i, err)
		}
	}
	close(g.open)
	if errs := answer(t, inFlight, "the claim in flight"); errs[0] != nil {
		t.Errorf("the claim in flight at Close: %v", errs[0])
	}
	if err := answer(t, closed, "Close"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.Claim(t.Context(), claim("after-close")); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("claim after Close: %v, want unavailable", err)
	}
}

// TestPipelineReplicaAcks: writes that wait for a replica share a pipeline on their
// master, and one WAIT at its end answers for all of them.
func TestPipelineReplicaAcks(t *testing.T) {
	t.Parallel()
	const calls = 20
	master := testredis.Start(t)
	testredis.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	wait.For(t, 10*time.Second, "the replica to attach", func() bool {
		reply, err := master.Command("WAIT", "1", "100")
		return err == nil && reply == ":1"
	})
	s, g := gatedStoreWith(t, master, redisstore.Options{Pipelines: 1, ReplicaAcks: 1, ReplicaTimeout: 5 * time.Second})
	held := claimAll(t.Context(), s, "held", 1)
	wait.For(t, 30*time.Second, "the one pipeline at the gate", func() bool { return g.holding(1) })
	queued := claimAll(t.Context(), s, "acked", calls)
	wait.For(t, 30*time.Second, "every other call queued", func() bool { return s.Queued() == calls })
	close(g.open)
	for i, err := range append(answer(t, held, "the held claim"), answer(t, queued, "the queued claims")...) {
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
	}
	// The held pipeline, which the fresh Redis answers NOSCRIPT and which goes again
	// with EVAL, then one with every queued write: three WAITs in all.
	c := g.counts()
	if c.pipelines != 2 || c.evalsha != calls+1 || c.eval != 1 || c.waits != 3 {
		t.Fatalf("%d replicated claims: %d pipelines, %d EVALSHA, %d EVAL, %d WAIT; want 2 pipelines, %d EVALSHA, 1 EVAL, 3 WAIT",
			calls+1, c.pipelines, c.evalsha, c.eval, c.waits, calls+1)
	}
}

// TestPipelineLanesRetire: a master's lane of pipelines goes once no call has used it
// for a while, so that the lanes of masters that left a Cluster (a node replaced, on
// a new address) do not pile up; the next call starts a new lane and is answered.
func TestPipelineLanesRetire(t *testing.T) {
	t.Parallel()
	s, g := gatedStore(t, testredis.Start(t), 2)
	close(g.open)
	s.SetLaneIdle(10 * time.Millisecond)
	for round := range 3 {
		if err := answer(t, claimAll(t.Context(), s, fmt.Sprintf("retire-%d", round), 8), "the claims")[0]; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if n := s.Lanes(); n != 1 {
			t.Fatalf("round %d: %d lanes after a call, want 1", round, n)
		}
		wait.For(t, 30*time.Second, "the unused lane retired", func() bool { return s.Lanes() == 0 })
	}
}

// TestPipelineLanesRetireUnderLoad: calls that arrive while lanes are retired and
// started again, over and over, are all answered; none waits in a lane whose workers
// have gone.
func TestPipelineLanesRetireUnderLoad(t *testing.T) {
	t.Parallel()
	s, g := gatedStore(t, testredis.Start(t), 1)
	close(g.open)
	s.SetLaneIdle(time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), wait.Scale(time.Minute))
	defer cancel()
	const rounds, callers, cycles = 20, 16, 5
	for round := range rounds {
		errs := make(chan error, callers*cycles)
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range cycles {
					cl := claim(fmt.Sprintf("load-%d-%d-%d", round, c, i))
					if _, err := s.Claim(ctx, cl); err != nil {
						errs <- fmt.Errorf("claim: %w", err)
						continue
					}
					if _, err := s.Complete(ctx, engine.Completion{ID: cl.ID, LeaseToken: cl.Token, Retention: time.Hour,
						Response: engine.Response{Status: 200}}); err != nil {
						errs <- fmt.Errorf("complete: %w", err)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if t.Failed() {
			return
		}
		if round%2 == 0 {
			wait.For(t, 30*time.Second, "the unused lane retired", func() bool { return s.Lanes() == 0 })
		}
	}
}

// TestPipelinesGrowOnASlowLink: when every pipeline takes long, as on a link to a
// distant Redis, more of them go at once, so that a call does not wait a round trip
// for a pipeline to come back before it can leave.
func TestPipelinesGrowOnASlowLink(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	relayed := make(chan error, 1)
	go func() { relayed <- netsplit.Relay(ctx, ln, srv.Addr(), 25*time.Millisecond, 0) }()
	// Registered first, so run after the store's cleanup: the relay outlives the
	// pipelines in it.
	t.Cleanup(func() {
		stop()
		if err := <-relayed; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	s, g := gatedStoreAt(t, "redis://"+ln.Addr().String(), redisstore.Options{Pipelines: 2})
	close(g.open)
	// A few round trips alone show the store how long the link is.
	for i := range 5 {
		if err := answer(t, claimAll(t.Context(), s, fmt.Sprintf("alone-%d", i), 1), "a claim")[0]; err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range answer(t, claimAll(t.Context(), s, "together", 32), "the claims") {
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
	}
	if c := g.counts(); c.mostFlying <= 2 {
		t.Fatalf("at most %d pipelines were in flight at once over a 50 ms round trip, want more than the 2 of a fast link", c.mostFlying)
	}
	// The metrics show it: more slots, and the round trip they come from.
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	got := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "master" || l[0].GetValue() != ln.Addr().String() {
				t.Errorf("%s is labelled %v, want master=%s", f.GetName(), l, ln.Addr())
			}
			got[f.GetName()] = m.GetGauge().GetValue()
		}
	}
	if got["idemd_redis_pipeline_slots"] <= 2 || got["idemd_redis_round_trip_seconds"] < 0.05 || got["idemd_redis_queued_calls"] != 0 {
		t.Fatalf("metrics %v, want more than 2 slots, a round trip of 50 ms or more and no call queued", got)
	}
}
