package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// logs collects a store's log lines; the store writes them from a goroutine of its own.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// openLayout opens a store over url that agrees its layout with the layout key, logging
// into the returned logs; the store is closed when the test ends.
func openLayout(t *testing.T, url string, layout redisstore.Layout) (*redisstore.Store, *logs) {
	t.Helper()
	out := &logs{}
	s, err := redisstore.OpenWith(url, redisstore.Options{Layout: layout, Logger: slog.New(slog.NewTextHandler(out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, out
}

// layoutKey reads the layout key through client, "" when it is absent.
func layoutKey(t *testing.T, client redis.UniversalClient) string {
	t.Helper()
	v, err := client.Get(t.Context(), redisstore.LayoutKey).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// completeOne claims and completes key through s, with body as the answer.
func completeOne(t *testing.T, s engine.Store, key, body string) {
	t.Helper()
	ctx := t.Context()
	id := engine.ID{Tenant: engine.DefaultTenant, Key: key}
	c := engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}
	if _, err := s.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, engine.Completion{ID: id, LeaseToken: c.Token, Retention: time.Hour,
		Response: engine.Response{Status: 201, Body: []byte(body)}}); err != nil {
		t.Fatal(err)
	}
}

// TestAutoLayout: a store told no layout takes the one the layout key names or, where
// there is none, the one that what the Redis holds allows, and writes it in the key.
func TestAutoLayout(t *testing.T) {
	t.Parallel()
	openScripts := func(t *testing.T, url, dir string) engine.Store {
		s, err := redisstore.OpenWithScripts(url, redisstore.Options{}, dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	for _, tc := range []struct {
		name string
		// before fills the Redis first.
		before func(t *testing.T, url string, client redis.UniversalClient)
		// earlier says that before completed the key "earlier" with the body "first".
		earlier bool
		// budget, when set, replaces the scan's budget.
		budget time.Duration
		want   redisstore.Layout
		why    string
	}{
		{"an empty Redis is lean only", nil, false, 0, redisstore.LayoutLeanOnly, "the Redis is empty"},
		{"other applications' keys only are lean only", func(t *testing.T, _ string, client redis.UniversalClient) {
			for _, k := range []string{"sessions:42", "idem:notes", "idem:default:not-a-digest", "{ab}x", "idem:" + strings.Repeat("a", 64)} {
				if err := client.Set(t.Context(), k, "x", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}, false, 0, redisstore.LayoutLeanOnly, "no record among its 5 keys"},
		{"records of the previous release keep strings", func(t *testing.T, url string, _ redis.UniversalClient) {
			completeOne(t, openScripts(t, url, previousScripts), "earlier", "first")
		}, true, 0, redisstore.LayoutStrings, "records of an earlier layout"},
		{"hashes of the release before keep strings", func(t *testing.T, url string, _ redis.UniversalClient) {
			completeOne(t, openScripts(t, url, earlierScripts), "earlier", "first")
		}, true, 0, redisstore.LayoutStrings, "records of an earlier layout"},
		{"lean records without the key are lean", func(t *testing.T, url string, _ redis.UniversalClient) {
			s, err := redisstore.OpenWith(url, redisstore.Options{LeanRecords: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			completeOne(t, s, "earlier", "first")
		}, true, 0, redisstore.LayoutLean, "lean records"},
		{"the key decides", func(t *testing.T, _ string, client redis.UniversalClient) {
			if err := client.Set(t.Context(), redisstore.LayoutKey, "lean-ready", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}, false, 0, redisstore.LayoutLeanReady, "the layout key says so"},
		{"a scan that runs out of time keeps strings", func(t *testing.T, _ string, client redis.UniversalClient) {
			if err := client.Set(t.Context(), "sessions:42", "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}, false, time.Nanosecond, redisstore.LayoutStrings, "stopped after 1ns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testredis.Start(t)
			client, err := redisstore.NewClient(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if tc.before != nil {
				tc.before(t, srv.URL(), client)
			}
			s, out := openLayout(t, srv.URL(), redisstore.LayoutAuto)
			if tc.budget > 0 {
				s.SetScanBudget(tc.budget)
			}
			a, err := s.AgreeLayout(t.Context())
			if err != nil || a.Layout != tc.want || !strings.Contains(a.Reason, tc.why) {
				t.Fatalf("AgreeLayout = %+v, %v; want %s, because %q", a, err, tc.want, tc.why)
			}
			if got := layoutKey(t, client); got != string(tc.want) {
				t.Errorf("the layout key says %q, want %q", got, tc.want)
			}
			if line := out.String(); !strings.Contains(line, "level=INFO") || !strings.Contains(line, "layout="+string(tc.want)) ||
				!strings.Contains(line, tc.why) {
				t.Errorf("the log says %q", line)
			}
			// The store works in the layout it chose, and a record of an earlier
			// daemon replays through it.
			completeOne(t, s, "after", "second")
			if tc.earlier {
				res, err := s.Claim(t.Context(), engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: "earlier"},
					Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()})
				if err != nil || res.Outcome != engine.OutcomeCompleted || string(res.Record.Response.Body) != "first" {
					t.Errorf("the earlier record through the store: %+v, %v", res, err)
				}
			}
			id := engine.ID{Tenant: engine.DefaultTenant, Key: "after"}
			written := redisstore.RecordKey(id)
			if tc.want == redisstore.LayoutLean || tc.want == redisstore.LayoutLeanOnly {
				written = redisstore.LeanKey(id)
			}
			if n, err := client.Exists(t.Context(), written).Result(); err != nil || n != 1 {
				t.Errorf("the record is not at the key that %s writes: %d, %v", tc.want, n, err)
			}
		})
	}
}

// TestAskedLayoutAndTheKey: a layout asked for moves the layout key forward, never
// back, and is refused beside a key more than one step further along the upgrade, or
// one this release does not know.
func TestAskedLayoutAndTheKey(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, tc := range []struct {
		key     string
		asked   redisstore.Layout
		refused bool
		after   string
	}{
		{"", redisstore.LayoutStrings, false, "strings"},
		{"", redisstore.LayoutLeanOnly, false, "lean-only"},
		{"", redisstore.LayoutHashes, false, "hashes"},
		{"hashes", redisstore.LayoutStrings, false, "strings"},
		{"strings", redisstore.LayoutHashes, false, "strings"},
		{"strings", redisstore.LayoutLeanReady, false, "lean-ready"},
		{"strings", redisstore.LayoutLean, false, "lean"},
		{"strings", redisstore.LayoutLeanOnly, false, "lean-only"},
		{"lean-ready", redisstore.LayoutStrings, false, "lean-ready"},
		{"lean", redisstore.LayoutLeanReady, false, "lean"},
		{"lean", redisstore.LayoutStrings, true, "lean"},
		{"lean", redisstore.LayoutHashes, true, "lean"},
		{"lean-only", redisstore.LayoutLean, false, "lean-only"},
		{"lean-only", redisstore.LayoutLeanReady, true, "lean-only"},
		{"lean-only", redisstore.LayoutStrings, true, "lean-only"},
		{"lean-only", redisstore.LayoutLeanOnly, false, "lean-only"},
		{"lean-2", redisstore.LayoutLeanOnly, true, "lean-2"},
	} {
		t.Run(fmt.Sprintf("%s under %q", tc.asked, tc.key), func(t *testing.T) {
			if err := client.Del(t.Context(), redisstore.LayoutKey).Err(); err != nil {
				t.Fatal(err)
			}
			if tc.key != "" {
				if err := client.Set(t.Context(), redisstore.LayoutKey, tc.key, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			s, _ := openLayout(t, srv.URL(), tc.asked)
			a, err := s.AgreeLayout(t.Context())
			switch {
			case tc.refused && !errors.Is(err, redisstore.ErrLayoutConflict):
				t.Errorf("AgreeLayout = %+v, %v; want a conflict", a, err)
			case !tc.refused && (err != nil || a.Layout != tc.asked):
				t.Errorf("AgreeLayout = %+v, %v; want %s", a, err, tc.asked)
			}
			if got := layoutKey(t, client); got != tc.after {
				t.Errorf("the layout key says %q, want %q", got, tc.after)
			}
			// A refused store answers unavailable, and writes nothing.
			_, err = s.Lookup(t.Context(), engine.ID{Tenant: engine.DefaultTenant, Key: "k"})
			if tc.refused != errors.Is(err, engine.ErrUnavailable) {
				t.Errorf("a lookup through the store: %v", err)
			}
		})
	}
}

// TestAutoLayoutUnknownKey: a layout key of a later release stops a store told no
// layout, which answers unavailable rather than write records those daemons would not
// read.
func TestAutoLayoutUnknownKey(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	if _, err := srv.Command("SET", redisstore.LayoutKey, "lean-2"); err != nil {
		t.Fatal(err)
	}
	s, out := openLayout(t, srv.URL(), redisstore.LayoutAuto)
	if _, err := s.AgreeLayout(t.Context()); !errors.Is(err, redisstore.ErrLayoutConflict) {
		t.Fatalf("AgreeLayout: %v, want a conflict", err)
	}
	if err := s.Ping(t.Context()); !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("Ping: %v, want unavailable", err)
	}
	if !strings.Contains(out.String(), "level=ERROR") || !strings.Contains(out.String(), "lean-2") {
		t.Errorf("the log says %q", out.String())
	}
}

// TestAutoLayoutRace: daemons starting at once on an empty Redis agree on one layout,
// and a daemon asked for strings at the same moment either sets the layout for all or
// is refused: never do two run in layouts that do not see each other's records.
func TestAutoLayoutRace(t *testing.T) {
	t.Parallel()
	for _, withStrings := range []bool{false, true} {
		t.Run(fmt.Sprintf("beside strings: %v", withStrings), func(t *testing.T) {
			t.Parallel()
			srv := testredis.Start(t)
			const n = 8
			stores := make([]*redisstore.Store, n)
			for i := range stores {
				layout := redisstore.LayoutAuto
				if withStrings && i%2 == 1 {
					layout = redisstore.LayoutStrings
				}
				stores[i], _ = openLayout(t, srv.URL(), layout)
			}
			agreed := make([]redisstore.Agreement, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, s := range stores {
				wg.Go(func() {
					<-start
					agreed[i], errs[i] = s.AgreeLayout(t.Context())
				})
			}
			close(start)
			wg.Wait()
			var running []redisstore.Layout
			for i := range stores {
				switch {
				case errors.Is(errs[i], redisstore.ErrLayoutConflict):
				case errs[i] != nil:
					t.Fatalf("store %d: %v", i, errs[i])
				default:
					running = append(running, agreed[i].Layout)
				}
			}
			if len(running) == 0 {
				t.Fatal("every store was refused")
			}
			for _, l := range running {
				if l != running[0] {
					t.Fatalf("the stores run %v", running)
				}
			}
			if !withStrings && (running[0] != redisstore.LayoutLeanOnly || len(running) != n) {
				t.Fatalf("the stores run %v, want lean-only all", running)
			}
			// What one writes, another sees.
			id := engine.ID{Tenant: engine.DefaultTenant, Key: "shared"}
			var first, second engine.Store
			for i, s := range stores {
				if errs[i] == nil && first == nil {
					first = s
				} else if errs[i] == nil {
					second = s
				}
			}
			if _, err := first.Claim(t.Context(), engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}); err != nil {
				t.Fatal(err)
			}
			var inProgress *engine.InProgressError
			if _, err := second.Claim(t.Context(), engine.Claim{ID: id, Lease: time.Minute, Retention: time.Hour, Token: engine.NewLeaseToken()}); !errors.As(err, &inProgress) {
				t.Fatalf("a second claim through another store: %v, want in progress", err)
			}
		})
	}
}

// TestAutoLayoutOnceRedisAnswers: a store whose Redis does not answer at first answers
// unavailable, and agrees its layout at its first call after Redis is back.
func TestAutoLayoutOnceRedisAnswers(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	srv.Stop()
	s, _ := openLayout(t, srv.URL(), redisstore.LayoutAuto)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := s.AgreeLayout(ctx); err == nil || errors.Is(err, redisstore.ErrLayoutConflict) {
		t.Fatalf("AgreeLayout with Redis down: %v", err)
	}
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "k"}
	if _, err := s.Lookup(ctx, id); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("a lookup with Redis down: %v, want unavailable", err)
	}
	srv.Restart()
	wait.For(t, 10*time.Second, "a lookup to answer once Redis is back", func() bool {
		_, err := s.Lookup(t.Context(), id)
		return errors.Is(err, engine.ErrNotFound)
	})
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if got := layoutKey(t, client); got != string(redisstore.LayoutLeanOnly) {
		t.Errorf("the layout key says %q, want lean-only", got)
	}
}

// TestConformanceAgreed runs the conformance suite on stores that agree their layout
// with the layout key, each at its first call.
func TestConformanceAgreed(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	enginetest.Run(t, func(t *testing.T) engine.Store {
		s, err := redisstore.OpenWith(srv.URL(), redisstore.Options{Layout: redisstore.LayoutAuto, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestAutoLayoutCluster: on a Cluster the layout key lives on the master of its slot,
// which every daemon reads; a record of an earlier layout on any master keeps strings.
func TestAutoLayoutCluster(t *testing.T) {
	t.Parallel()
	cluster := testredis.StartCluster(t)
	universal, err := redisstore.NewClient(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer universal.Close()
	client := universal.(*redis.ClusterClient)
	ctx := t.Context()
	var mu sync.Mutex
	var masters []string
	if err := client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, m.Options().Addr)
		return nil
	}); err != nil || len(masters) != 3 {
		t.Fatalf("masters %v, %v", masters, err)
	}
	flush := func(t *testing.T) {
		t.Helper()
		if err := client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FlushAll(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
	}
	keyMaster, err := client.MasterForKey(ctx, redisstore.LayoutKey)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("an empty cluster is lean only, for every daemon", func(t *testing.T) {
		flush(t)
		for i, why := range []string{"the Redis is empty", "the layout key says so"} {
			s, _ := openLayout(t, cluster.URL(), redisstore.LayoutAuto)
			if a, err := s.AgreeLayout(ctx); err != nil || a.Layout != redisstore.LayoutLeanOnly || !strings.Contains(a.Reason, why) {
				t.Fatalf("daemon %d: %+v, %v", i, a, err)
			}
			completeOne(t, s, fmt.Sprintf("k%d", i), "done")
		}
		if got, err := keyMaster.Get(ctx, redisstore.LayoutKey).Result(); err != nil || got != "lean-only" {
			t.Fatalf("the layout key on %s: %q, %v", keyMaster.Options().Addr, got, err)
		}
	})
	for _, addr := range masters {
		t.Run("a record of the previous release on "+addr, func(t *testing.T) {
			flush(t)
			old, err := redisstore.OpenWithScripts(cluster.URL(), redisstore.Options{}, previousScripts)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			key := ""
			for i := 0; i < 1000 && key == ""; i++ {
				k := fmt.Sprintf("k%d", i)
				m, err := client.MasterForKey(ctx, redisstore.RecordKey(engine.ID{Tenant: engine.DefaultTenant, Key: k}))
				if err != nil {
					t.Fatal(err)
				}
				if m.Options().Addr == addr {
					key = k
				}
			}
			completeOne(t, old, key, "first")
			s, _ := openLayout(t, cluster.URL(), redisstore.LayoutAuto)
			if a, err := s.AgreeLayout(ctx); err != nil || a.Layout != redisstore.LayoutStrings {
				t.Fatalf("AgreeLayout: %+v, %v; want strings", a, err)
			}
			res, err := s.Claim(ctx, engine.Claim{ID: engine.ID{Tenant: engine.DefaultTenant, Key: key}, Lease: time.Minute,
				Retention: time.Hour, Token: engine.NewLeaseToken()})
			if err != nil || res.Outcome != engine.OutcomeCompleted || string(res.Record.Response.Body) != "first" {
				t.Fatalf("a replay of the previous release's record: %+v, %v", res, err)
			}
			if got, err := keyMaster.Get(ctx, redisstore.LayoutKey).Result(); err != nil || got != "strings" {
				t.Fatalf("the layout key on %s: %q, %v", keyMaster.Options().Addr, got, err)
			}
		})
	}
}

// TestAutoLayoutSentinel: daemons over Sentinel agree through the key on its master.
func TestAutoLayoutSentinel(t *testing.T) {
	t.Parallel()
	sentinel := testredis.StartSentinel(t)
	for i, why := range []string{"the Redis is empty", "the layout key says so"} {
		s, _ := openLayout(t, sentinel.URL(), redisstore.LayoutAuto)
		if a, err := s.AgreeLayout(t.Context()); err != nil || a.Layout != redisstore.LayoutLeanOnly || !strings.Contains(a.Reason, why) {
			t.Fatalf("daemon %d: %+v, %v", i, a, err)
		}
		completeOne(t, s, fmt.Sprintf("k%d", i), "done")
	}
}

// TestLayoutKeyKept: a store that agreed its layout writes it back into a layout key
// that is gone, as after a Redis restarted without persistence, so that a daemon
// started afterwards joins it rather than taking the Redis for a new one.
func TestLayoutKeyKept(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	running, _ := openLayout(t, srv.URL(), redisstore.LayoutStrings)
	if _, err := running.AgreeLayout(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv.Restart()
	client, err := redisstore.NewClient(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	wait.For(t, 10*time.Second, "the layout key to be written back", func() bool {
		v, err := client.Get(t.Context(), redisstore.LayoutKey).Result()
		return err == nil && v == "strings"
	})
	later, _ := openLayout(t, srv.URL(), redisstore.LayoutAuto)
	if a, err := later.AgreeLayout(t.Context()); err != nil || a.Layout != redisstore.LayoutStrings {
		t.Fatalf("a daemon started after the restart: %+v, %v; want strings", a, err)
	}
}

// TestLayoutKeyMovedAway: a store whose layout the layout key no longer runs beside
// (a daemon started two steps ahead) answers unavailable, and serves again once the
// key names a layout beside its own.
func TestLayoutKeyMovedAway(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	running, out := openLayout(t, srv.URL(), redisstore.LayoutStrings)
	id := engine.ID{Tenant: engine.DefaultTenant, Key: "k"}
	if _, err := running.Lookup(t.Context(), id); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("a lookup: %v", err)
	}
	ahead, _ := openLayout(t, srv.URL(), redisstore.LayoutLeanOnly)
	if a, err := ahead.AgreeLayout(t.Context()); err != nil || a.Layout != redisstore.LayoutLeanOnly {
		t.Fatalf("a daemon two steps ahead: %+v, %v", a, err)
	}
	wait.For(t, 10*time.Second, "the strings store to stop serving", func() bool {
		_, err := running.Lookup(t.Context(), id)
		return errors.Is(err, engine.ErrUnavailable) && errors.Is(err, redisstore.ErrLayoutConflict)
	})
	if !strings.Contains(out.String(), "level=ERROR") {
		t.Errorf("the log says %q", out.String())
	}
	if _, err := srv.Command("SET", redisstore.LayoutKey, "lean-ready"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the strings store to serve again", func() bool {
		_, err := running.Lookup(t.Context(), id)
		return errors.Is(err, engine.ErrNotFound)
	})
	if !strings.Contains(out.String(), "agreed again") {
		t.Errorf("the log says %q", out.String())
	}
}
