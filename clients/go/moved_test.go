package idem_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// markMoved turns the record of key (the strings layout, tenant default) into the
// marker a live move leaves while it hands the record over: the record's fields kept,
// its state m.
const markMoved = `local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local l, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa = cmsgpack.unpack(v)
redis.call('SET', KEYS[1], cmsgpack.pack(l, k, t, 'm', fp, ow, at, tok, lx, rec, ca, ua, xa), 'KEEPTTL')
return 1`

// movedRedis starts a Redis of its own and a daemon over it, and returns the daemon's
// URL and a function that marks a key of the daemon as moving.
func movedRedis(t *testing.T) (string, func(key string)) {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("IDEMD_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server is not installed")
		}
		t.Skip("redis-server is not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(server, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	cli := func(args ...string) string {
		out, err := exec.Command("redis-cli", append([]string{"-p", fmt.Sprint(port)}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if err := testenv.Until(20*time.Second, func() error {
		if out, err := exec.Command("redis-cli", "-p", fmt.Sprint(port), "PING").CombinedOutput(); err != nil || !strings.Contains(string(out), "PONG") {
			return fmt.Errorf("redis not up: %v %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d := ownDaemon(t, "--store", fmt.Sprintf("redis://127.0.0.1:%d/0", port), "--redis-record-layout", "strings")
	return d.URL, func(key string) {
		t.Helper()
		sum := sha256.Sum256([]byte(key))
		if out := cli("EVAL", markMoved, "1", "idem:default:"+hex.EncodeToString(sum[:])); out != "(integer) 1" && out != "1" {
			t.Fatalf("no record of %q to mark: %s", key, out)
		}
	}
}

// TestStoreMoved: a key whose record is being moved to another store answers 503
// store_moved, which the client reports as a *Problem with the daemon's wait, and not
// as ErrUnavailable: the key is not free, so a middleware that fails open on an
// outage still refuses the request and never runs the operation again.
func TestStoreMoved(t *testing.T) {
	url, mark := movedRedis(t)
	// No replay cache: a finished result this client saw would be replayed from memory,
	// rightly, without asking idemd.
	c, err := idem.New(url, idem.WithRetries(0), idem.WithReplayCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	cl, err := c.Claim(ctx, "moved-held", idem.ClaimOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	mark("moved-held")
	moved := func(what string, err error) {
		t.Helper()
		var p *idem.Problem
		if !errors.As(err, &p) || p.Status != http.StatusServiceUnavailable || p.Code != "store_moved" || p.RetryAfter <= 0 {
			t.Fatalf("%s: %v, want a 503 store_moved problem with a wait", what, err)
		}
		if errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("%s: %v matches an error it is not", what, err)
		}
	}
	_, err = c.Claim(ctx, "moved-held", idem.ClaimOptions{})
	moved("claim", err)
	_, err = c.Extend(ctx, "moved-held", cl.Token, time.Minute)
	moved("extend", err)
	moved("complete", c.Complete(ctx, "moved-held", cl.Token, idem.Response{Status: 200}))
	_, err = c.Lookup(ctx, "moved-held")
	moved("lookup", err)

	// Through the middleware, failing open: the first request completes, its record
	// is marked, and the retry is refused without running the handler.
	var inc incidents
	h := &orders{}
	mw := serveWith(t, c, h, idem.WithFailOpen(nil), inc.option())
	first := call{key: "order-1", body: `{"amount":1}`}.do(t, mw)
	if first.status != http.StatusCreated || h.runs.Load() != 1 {
		t.Fatalf("first request: %+v", first)
	}
	mark(idem.MiddlewareKey("alice", "order-1"))
	for range 3 {
		retry := call{key: "order-1", body: `{"amount":1}`}.do(t, mw)
		if retry.status != http.StatusServiceUnavailable || retry.problemCode() != "idempotency_unavailable" || retry.header.Get("Retry-After") == "" {
			t.Fatalf("retry of a moving key: %+v", retry)
		}
	}
	if n := h.runs.Load(); n != 1 || inc.count(idem.IncidentIdemdRefused) != 3 || inc.count(idem.IncidentFailOpen) != 0 {
		t.Fatalf("the handler ran %d times; incidents %v", n, &inc)
	}
}
