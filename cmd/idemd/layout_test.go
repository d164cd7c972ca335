package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// serve runs an opened daemon until stop is called or the test ends.
func serve(t *testing.T, m *Main) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			if err := m.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// startLogged runs the daemon with args on loopback until stop is called or the test
// ends, its log (at info level) in the returned buffer.
func startLogged(t *testing.T, args ...string) (m *Main, logs *syncBuffer, stop func()) {
	t.Helper()
	m = NewMain()
	if err := m.ParseFlags(append([]string{"--listen", "127.0.0.1:0"}, args...)); err != nil {
		t.Fatal(err)
	}
	logs = &syncBuffer{}
	m.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	if err := m.Open(); err != nil {
		t.Fatalf("the daemon did not start: %v\n%s", err, logs)
	}
	return m, logs, serve(t, m)
}

// layoutLine is the daemon's log line about the record layout.
type layoutLine struct {
	Level  string `json:"level"`
	Msg    string `json:"msg"`
	Layout string `json:"layout"`
	Why    string `json:"why"`
}

func layoutLogged(t *testing.T, logs *syncBuffer) layoutLine {
	t.Helper()
	var found []layoutLine
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var l layoutLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "redis record layout" {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d lines about the record layout in the log:\n%s", len(found), logs)
	}
	return found[0]
}

// redisClient is a client of the Redis at url, closed when the test ends.
func redisClient(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	c, err := redisstore.NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func layoutKeyOf(t *testing.T, c redis.UniversalClient) string {
	t.Helper()
	v, err := c.Get(t.Context(), redisstore.LayoutKey).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

// idleMemory is Redis's own count of the memory it holds (INFO memory: used_memory),
// once no client but c is connected: a daemon's connections hold buffers that Redis
// trims only now and then.
func idleMemory(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	fields := func(section string) map[string]int64 {
		info, err := c.Info(t.Context(), section).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for line := range strings.SplitSeq(info, "\r\n") {
			name, v, _ := strings.Cut(line, ":")
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				out[name] = n
			}
		}
		return out
	}
	wait.For(t, 10*time.Second, "the daemons' connections to close", func() bool {
		return fields("clients")["connected_clients"] == 1
	})
	used, ok := fields("memory")["used_memory"]
	if !ok {
		t.Fatal("INFO memory has no used_memory")
	}
	return used
}

// completeKeys claims and completes keys prefix0 … prefix(n-1) (padded to 40 bytes,
// each with a fingerprint of 32 hex digits) through the daemon at base, over a few
// connections at once, with an empty answer.
func completeKeys(t *testing.T, base, prefix string, n int) {
	t.Helper()
	client := &http.Client{Timeout: wait.Scale(10 * time.Second), Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	call := func(path, body string, want int) (map[string]any, error) {
		resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return nil, err
		}
		if resp.StatusCode != want {
			return nil, fmt.Errorf("%s %s: %d %v", path, body, resp.StatusCode, out)
		}
		return out, nil
	}
	const workers = 8
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				key := paddedKey(prefix, i)
				claim, err := call("/v1/claim", fmt.Sprintf(`{"key":%q,"fingerprint":%q}`, key, fingerprintOf(i)), http.StatusCreated)
				if err != nil {
					errs <- err
					return
				}
				if _, err := call("/v1/complete", fmt.Sprintf(`{"key":%q,"lease_token":%q,"response":{"status":201}}`, key, claim["lease_token"]), http.StatusOK); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// paddedKey is the key completeKeys uses: prefix, then i padded to 40 bytes.
func paddedKey(prefix string, i int) string { return fmt.Sprintf("%s%0*d", prefix, 40-len(prefix), i) }

// fingerprintOf is the fingerprint completeKeys sends with the key of i.
func fingerprintOf(i int) string { return fmt.Sprintf("%032x", i) }

// TestNewRedisStartsLean: a daemon told no layout, on an empty Redis, keeps its records
// in the lean layout: Redis's own count of its memory grows by about 0.6 as much per
// completed record as under a daemon told strings, on another empty Redis. The layout
// key then says lean-only, and the log says why.
func TestNewRedisStartsLean(t *testing.T) {
	const warmup, records = 100, 2000
	perRecord := map[string]float64{}
	for _, tc := range []struct {
		name string
		args []string
		want string
		why  string
	}{
		{"told nothing", nil, "lean-only", "the Redis is empty"},
		{"told strings", []string{"--redis-record-layout", "strings"}, "strings", "as asked"},
	} {
		r := testredis.Start(t)
		c := redisClient(t, r.URL())
		args := append([]string{"--store", r.URL()}, tc.args...)
		// A first daemon loads the scripts and writes the layout key, which a
		// record does not cost; its connections closed, the next daemon's records are
		// all that grows.
		m, logs, stop := startLogged(t, args...)
		completeKeys(t, "http://"+m.Addr(), "warmup-", warmup)
		stop()
		if l := layoutLogged(t, logs); l.Level != "INFO" || l.Layout != tc.want || !strings.Contains(l.Why, tc.why) {
			t.Errorf("%s: the log says %+v", tc.name, l)
		}
		before := idleMemory(t, c)
		m, _, stop = startLogged(t, args...)
		completeKeys(t, "http://"+m.Addr(), "order-", records)
		stop()
		perRecord[tc.name] = float64(idleMemory(t, c)-before) / records
		if got := layoutKeyOf(t, c); got != tc.want {
			t.Errorf("%s: the layout key says %q, want %q", tc.name, got, tc.want)
		}
	}
	lean, strs := perRecord["told nothing"], perRecord["told strings"]
	t.Logf("Redis memory per completed record: %.0f bytes told nothing, %.0f told strings (%.2f)", lean, strs, lean/strs)
	if lean <= 0 || lean > 0.75*strs {
		t.Fatalf("a record takes %.0f bytes of Redis's memory from a daemon told nothing, %.0f from one told strings: want at most 0.75 of it", lean, strs)
	}
}

// TestEarlierRecordsKeepStrings: a daemon told no layout, on a Redis that holds records
// at the earlier keys and no layout key (as the previous release leaves it), keeps
// writing strings, answers for those records, and says so in its log.
func TestEarlierRecordsKeepStrings(t *testing.T) {
	r := testredis.Start(t)
	c := redisClient(t, r.URL())
	earlier, _, _ := startMain(t, "--store", r.URL(), "--redis-record-layout", "strings")
	base := "http://" + earlier.Addr()
	completeKeys(t, base, "earlier-", 20)
	if code, body, err := post(base+"/v1/claim", `{"key":"held","lease_ms":60000}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}
	// The previous release writes no layout key.
	if err := c.Del(t.Context(), redisstore.LayoutKey).Err(); err != nil {
		t.Fatal(err)
	}

	m, logs, _ := startLogged(t, "--store", r.URL())
	if l := layoutLogged(t, logs); l.Layout != "strings" || !strings.Contains(l.Why, "records of an earlier layout") ||
		!strings.Contains(l.Why, "previous release") {
		t.Fatalf("the log says %+v", l)
	}
	if got := layoutKeyOf(t, c); got != "strings" {
		t.Errorf("the layout key says %q, want strings", got)
	}
	now := "http://" + m.Addr()
	if code, body, err := post(now+"/v1/claim", fmt.Sprintf(`{"key":%q,"fingerprint":%q}`, paddedKey("earlier-", 7), fingerprintOf(7))); err != nil || code != 200 || !strings.Contains(body, `"outcome":"completed"`) {
		t.Fatalf("a replay of an earlier record: %d %s %v", code, body, err)
	}
	resp, err := http.Get(now + "/v1/records/" + paddedKey("earlier-", 11))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a lookup of an earlier record: %d", resp.StatusCode)
	}
	if code, body, err := post(now+"/v1/claim", `{"key":"held"}`); err != nil || code != 409 {
		t.Fatalf("a claim of a key held through the earlier daemon: %d %s %v, want 409", code, body, err)
	}
	// What this daemon writes, the earlier one reads.
	completeKeys(t, now, "later-", 5)
	if code, body, err := post(base+"/v1/claim", fmt.Sprintf(`{"key":%q,"fingerprint":%q}`, paddedKey("later-", 3), fingerprintOf(3))); err != nil || code != 200 {
		t.Fatalf("a replay through the earlier daemon: %d %s %v", code, body, err)
	}
}

// TestDaemonsStartingTogetherAgree: daemons told no layout that start at the same
// moment on an empty Redis take one layout, and each sees the keys the other holds.
func TestDaemonsStartingTogetherAgree(t *testing.T) {
	r := testredis.Start(t)
	const n = 3
	mains := make([]*Main, n)
	logs := make([]*syncBuffer, n)
	for i := range mains {
		mains[i] = NewMain()
		if err := mains[i].ParseFlags([]string{"--listen", "127.0.0.1:0", "--store", r.URL()}); err != nil {
			t.Fatal(err)
		}
		logs[i] = &syncBuffer{}
		mains[i].Logger = slog.New(slog.NewJSONHandler(logs[i], nil))
	}
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, m := range mains {
		wg.Go(func() {
			<-start
			errs[i] = m.Open()
		})
	}
	close(start)
	wg.Wait()
	for i, m := range mains {
		if errs[i] != nil {
			t.Fatalf("daemon %d did not start: %v", i, errs[i])
		}
		serve(t, m)
		if l := layoutLogged(t, logs[i]); l.Layout != "lean-only" {
			t.Errorf("daemon %d: %+v", i, l)
		}
	}
	if got := layoutKeyOf(t, redisClient(t, r.URL())); got != "lean-only" {
		t.Errorf("the layout key says %q, want lean-only", got)
	}
	if code, body, err := post("http://"+mains[0].Addr()+"/v1/claim", `{"key":"together","lease_ms":60000}`); err != nil || code != 201 {
		t.Fatalf("claim: %d %s %v", code, body, err)
	}
	for _, m := range mains[1:] {
		if code, body, err := post("http://"+m.Addr()+"/v1/claim", `{"key":"together"}`); err != nil || code != 409 {
			t.Fatalf("a claim of the held key through another daemon: %d %s %v, want 409", code, body, err)
		}
	}
}

// TestStringsRefusedOnALeanRedis: a daemon told strings does not start on a Redis
// whose daemons keep lean records only, and says why and how to go on.
func TestStringsRefusedOnALeanRedis(t *testing.T) {
	r := testredis.Start(t)
	startLogged(t, "--store", r.URL())
	m := NewMain()
	if err := m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--store", r.URL(), "--redis-record-layout", "strings", "--log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.DiscardHandler)
	err := m.Open()
	if !errors.Is(err, redisstore.ErrLayoutConflict) || !strings.Contains(err.Error(), "--redis-record-layout strings") ||
		!strings.Contains(err.Error(), "lean-only") {
		t.Fatalf("Open = %v, want a layout conflict", err)
	}
	if m.Addr() != "" {
		t.Error("the refused daemon listens")
	}
}
