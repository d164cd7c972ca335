package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/testing/wait"
)

// gate holds the store's first write transaction of transitions until released, so
// that a test can queue others behind it in a known order, and records the number of
// transitions in every write transaction.
type gate struct {
	held    chan int
	release chan struct{}
	once    sync.Once

	mu    sync.Mutex
	sizes []int
}

func holdFirstCommit(t *testing.T, s *boltstore.Store) *gate {
	t.Helper()
	g := &gate{held: make(chan int, 1), release: make(chan struct{})}
	first := true
	boltstore.OnTx(s, func(n int) {
		g.mu.Lock()
		g.sizes = append(g.sizes, n)
		hold := first
		first = false
		g.mu.Unlock()
		if hold {
			g.held <- n
			<-g.release
		}
	})
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// txSizes is the number of transitions in each write transaction so far.
func (g *gate) txSizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sizes)
}

// heldBy starts the transition do and waits until the commit loop holds it.
func (g *gate) heldBy(t *testing.T, do func() error) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- do() }()
	select {
	case n := <-g.held:
		if n != 1 {
			t.Fatalf("the first write transaction holds %d transitions, want 1", n)
		}
	case <-time.After(wait.Scale(10 * time.Second)):
		t.Fatal("the first transition never reached a commit")
	}
	return done
}

// queue starts the transition do and waits until it is queued behind the held commit,
// so that transitions queued one after the other keep their order.
func queue(t *testing.T, s *boltstore.Store, do func() error) <-chan error {
	t.Helper()
	before := boltstore.Queued(s)
	done := make(chan error, 1)
	go func() { done <- do() }()
	wait.For(t, 10*time.Second, fmt.Sprintf("%d queued transitions", before+1), func() bool { return boltstore.Queued(s) == before+1 })
	return done
}

func recv(t *testing.T, c <-chan error) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(wait.Scale(10 * time.Second)):
		t.Fatal("a transition never answered")
		return nil
	}
}

func claimFn(s *boltstore.Store, key, token string) func() error {
	return func() error {
		res, err := s.Claim(context.Background(), engine.Claim{ID: id(key), Lease: time.Minute, Retention: time.Hour, Token: token})
		if err == nil && res.Outcome != engine.OutcomeAcquired {
			return fmt.Errorf("claim %s: %s, want acquired", key, res.Outcome)
		}
		return err
	}
}

func completeFn(s *boltstore.Store, key, token string) func() error {
	return func() error {
		rec, err := s.Complete(context.Background(), engine.Completion{ID: id(key), LeaseToken: token, Retention: time.Hour,
			Response: engine.Response{Status: 200, Body: []byte(key)}})
		if err == nil && rec.State != engine.StateCompleted {
			return fmt.Errorf("complete %s: %s, want completed", key, rec.State)
		}
		return err
	}
}

func state(t *testing.T, s *boltstore.Store, key string) engine.State {
	t.Helper()
	rec, err := s.Lookup(ctx(t), id(key))
	if errors.Is(err, engine.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("lookup %s: %v", key, err)
	}
	return rec.State
}

// TestConcurrentTransitionsShareCommits queues many claims behind a commit in progress:
// they must all go into the next write transaction, one fsync for all of them.
func TestConcurrentTransitionsShareCommits(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	g := holdFirstCommit(t, s)
	first := g.heldBy(t, claimFn(s, "first", engine.NewLeaseToken()))
	const n = 40
	answers := make([]<-chan error, n)
	for i := range n {
		answers[i] = queue(t, s, claimFn(s, fmt.Sprintf("k%d", i), engine.NewLeaseToken()))
	}
	g.open()
	if err := recv(t, first); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := recv(t, answers[i]); err != nil {
			t.Fatal(err)
		}
		if st := state(t, s, fmt.Sprintf("k%d", i)); st != engine.StatePending {
			t.Fatalf("k%d is %q after its claim, want pending", i, st)
		}
	}
	if got := g.txSizes(); !slices.Equal(got, []int{1, n}) {
		t.Fatalf("%d transitions went into write transactions of %v, want [1 %d]", n+1, got, n)
	}
}

// TestGroupKeepsOrder queues a claim, then the complete of the same key with the
// claim's token, in one group: the complete must see the claim's write.
func TestGroupKeepsOrder(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	g := holdFirstCommit(t, s)
	first := g.heldBy(t, claimFn(s, "first", engine.NewLeaseToken()))
	token := engine.NewLeaseToken()
	claimed := queue(t, s, claimFn(s, "k", token))
	completed := queue(t, s, completeFn(s, "k", token))
	g.open()
	for _, c := range []<-chan error{first, claimed, completed} {
		if err := recv(t, c); err != nil {
			t.Fatal(err)
		}
	}
	if st := state(t, s, "k"); st != engine.StateCompleted {
		t.Fatalf("k is %q, want completed", st)
	}
	if got := g.txSizes(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("write transactions of %v, want [1 2]: the claim and the complete in one", got)
	}
}

// TestFailingTransitionIsIsolated puts a transition that fails (its record cannot be
// decoded) in the middle of a group: it alone must fail, and the others, before and
// after it, on the same key, must be applied in order.
func TestFailingTransitionIsIsolated(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err := boltstore.Corrupt(s, id("bad")); err != nil {
		t.Fatal(err)
	}
	g := holdFirstCommit(t, s)
	first := g.heldBy(t, claimFn(s, "first", engine.NewLeaseToken()))
	token := engine.NewLeaseToken()
	claimedA := queue(t, s, claimFn(s, "a", token))
	bad := queue(t, s, completeFn(s, "bad", engine.NewLeaseToken()))
	completedA := queue(t, s, completeFn(s, "a", token))
	claimedB := queue(t, s, claimFn(s, "b", engine.NewLeaseToken()))
	g.open()
	for _, c := range []<-chan error{first, claimedA, completedA, claimedB} {
		if err := recv(t, c); err != nil {
			t.Fatalf("a transition next to a failing one: %v", err)
		}
	}
	if err := recv(t, bad); !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("complete of a corrupt record: %v, want unavailable, corrupt", err)
	}
	if a, b := state(t, s, "a"), state(t, s, "b"); a != engine.StateCompleted || b != engine.StatePending {
		t.Fatalf("a is %q and b %q, want completed and pending", a, b)
	}
	if got := g.txSizes(); len(got) < 2 || got[1] != 4 {
		t.Fatalf("write transactions of %v: the four queued transitions were not tried as one group", got)
	}
}

// TestCancelledWhileQueuedIsNotApplied cancels a claim while it waits for its group:
// it answers at once with the context's error, and is never applied.
func TestCancelledWhileQueuedIsNotApplied(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	g := holdFirstCommit(t, s)
	first := g.heldBy(t, claimFn(s, "first", engine.NewLeaseToken()))
	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := queue(t, s, func() error {
		_, err := s.Claim(c, engine.Claim{ID: id("gone"), Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
		return err
	})
	cancel()
	if err := recv(t, gone); !errors.Is(err, context.Canceled) {
		t.Fatalf("claim cancelled while queued: %v, want context.Canceled", err)
	}
	g.open()
	if err := recv(t, first); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "gone"); st != "" {
		t.Fatalf("the cancelled claim was applied: gone is %q", st)
	}
	if got := g.txSizes(); !slices.Equal(got, []int{1}) {
		t.Fatalf("write transactions of %v, want only the first", got)
	}
}

// TestCloseCommitsQueuedTransitions closes the store while a transition waits behind a
// commit: Close commits it, durably, then later transitions are unavailable.
func TestCloseCommitsQueuedTransitions(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idemd.db")
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := holdFirstCommit(t, s)
	first := g.heldBy(t, claimFn(s, "first", engine.NewLeaseToken()))
	queued := queue(t, s, claimFn(s, "queued", engine.NewLeaseToken()))
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	wait.For(t, 10*time.Second, "the store to refuse new transitions", func() bool { return boltstore.Closing(s) })
	g.open()
	for _, c := range []<-chan error{first, queued, closed} {
		if err := recv(t, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := claimFn(s, "late", engine.NewLeaseToken())(); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("claim after close: %v, want unavailable", err)
	}
	if err := s.Purge(ctx(t), id("first")); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("purge after close: %v, want unavailable", err)
	}
	s = open(t, path, boltstore.Options{})
	if a, b := state(t, s, "first"), state(t, s, "queued"); a != engine.StatePending || b != engine.StatePending {
		t.Fatalf("after reopening, first is %q and queued %q, want both pending", a, b)
	}
}

// TestHungCommitAnswersAtTheDeadline holds a commit as a disk that stops answering
// would: a transition in it answers its context's error at its deadline instead of
// waiting for the disk, and once the commit goes through, its waiters are woken all the
// same.
func TestHungCommitAnswersAtTheDeadline(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	token := engine.NewLeaseToken()
	if err := claimFn(s, "held", token)(); err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx(t), id("held"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	g := holdFirstCommit(t, s)
	c, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := g.heldBy(t, func() error {
		_, err := s.Complete(c, engine.Completion{ID: id("held"), LeaseToken: token, Retention: time.Hour,
			Response: engine.Response{Status: 200}})
		return err
	})
	// The commit is still held: the answer can only come from the deadline.
	if err := recv(t, done); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a completion in a hung commit: %v, want context.DeadlineExceeded", err)
	}
	g.open()
	select {
	case <-w.C():
	case <-time.After(wait.Scale(10 * time.Second)):
		t.Fatal("the completion committed after its caller left woke no waiter")
	}
	if st := state(t, s, "held"); st != engine.StateCompleted {
		t.Fatalf("held is %q after the commit went through, want completed", st)
	}
}
