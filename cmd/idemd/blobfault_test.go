package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/netsplit"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/tests3"
	"github.com/idemd/idemd/internal/testing/wait"
)

// tenantAnswer is what the fault tests read of an answer.
type tenantAnswer struct {
	Status     int
	Code       string `json:"code"`
	LeaseToken string `json:"lease_token"`
	State      string `json:"state"`
	Response   *struct {
		Status int    `json:"status"`
		Body   []byte `json:"body"`
	} `json:"response"`
}

// tenant calls a daemon with one tenant's token.
type tenant struct {
	base  func() string
	token string
}

func (c tenant) call(t *testing.T, method, path string, body any) tenantAnswer {
	t.Helper()
	a, err := c.do(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// do is call for a goroutine of the test's own: it answers the error instead of
// failing the test.
func (c tenant) do(method, path string, body any) (tenantAnswer, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return tenantAnswer{}, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base()+path, r)
	if err != nil {
		return tenantAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return tenantAnswer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	var a tenantAnswer
	if resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			return tenantAnswer{}, fmt.Errorf("%s %s: %d, undecodable: %w", method, path, resp.StatusCode, err)
		}
	}
	a.Status = resp.StatusCode
	return a, nil
}

func (c tenant) claim(t *testing.T, key string) tenantAnswer {
	t.Helper()
	return c.call(t, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp", "lease_ms": 600_000})
}

func (c tenant) complete(t *testing.T, key, token string, body []byte) tenantAnswer {
	t.Helper()
	return c.call(t, http.MethodPost, "/v1/complete", completionOf(key, token, body))
}

func completionOf(key, token string, body []byte) map[string]any {
	return map[string]any{"key": key, "lease_token": token,
		"response": map[string]any{"status": 200, "headers": map[string][]string{"Content-Type": {"application/octet-stream"}}, "body": body}}
}

func (c tenant) lookup(t *testing.T, key string) tenantAnswer {
	t.Helper()
	return c.call(t, http.MethodGet, "/v1/records/"+url.PathEscape(key), nil)
}

// replays says whether a claim of key replays body, byte for byte.
func (c tenant) replays(t *testing.T, key string, body []byte) error {
	t.Helper()
	a := c.claim(t, key)
	if a.Status != http.StatusOK || a.Response == nil || !bytes.Equal(a.Response.Body, body) {
		n := -1
		if a.Response != nil {
			n = len(a.Response.Body)
		}
		return fmt.Errorf("replay of %s: %d %s, %d bytes; want 200 and the %d bytes completed", key, a.Status, a.Code, n, len(body))
	}
	return nil
}

// completes claims key and completes it with body; the completion must be answered 200.
func (c tenant) completes(t *testing.T, key string, body []byte) {
	t.Helper()
	a := c.claim(t, key)
	if a.Status != http.StatusCreated {
		t.Fatalf("claim %s: %d %s", key, a.Status, a.Code)
	}
	if d := c.complete(t, key, a.LeaseToken, body); d.Status != http.StatusOK {
		t.Fatalf("complete %s with %d bytes: %d %s", key, len(body), d.Status, d.Code)
	}
}

// twoTenants writes an auth file of two tenants, shop and other, and answers the flag
// that gives it to a daemon and a caller for each.
func twoTenants(t *testing.T, base func() string) (flag string, shop, other tenant) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeTestFile(t, path, "tenants:\n  shop: {}\n  other: {}\ntokens:\n"+
		"  - {tenant: shop, scopes: [use], sha256: "+sha256Hex("shop-token")+"}\n"+
		"  - {tenant: other, scopes: [use], sha256: "+sha256Hex("other-token")+"}\n")
	return path, tenant{base, "shop-token"}, tenant{base, "other-token"}
}

// blobFault is one way the blob store stops serving, and how it comes back.
type blobFault struct {
	// before says whether a large result can be stored before the fault: not when the
	// fault is there from the start.
	before       bool
	breaks, heal func(t *testing.T)
}

// throughBlobFault drives a daemon through a fault of its blob store. While the
// store fails: large completions, more at once than the daemon writes at once, answer
// 503 store_unavailable (within the blob deadline and their wait for a turn; the time
// is logged, not held to a bound) and store nothing, their keys still pending under
// the same leases; small results of the same tenant and of another are
// stored and replayed meanwhile; replays of a large result answer 503. Once the store
// is back: the large result stored before replays byte for byte, the same lease
// completes large, and every result acknowledged replays byte for byte, each checked
// by the daemon against the size and SHA-256 its record keeps.
func throughBlobFault(t *testing.T, shop, other tenant, f blobFault) {
	t.Helper()
	acked := map[string][]byte{}
	if f.before {
		acked["before"] = randomBody(t, 256<<10)
		shop.completes(t, "before", acked["before"])
		if err := shop.replays(t, "before", acked["before"]); err != nil {
			t.Fatal(err)
		}
	}
	// More large completions at once than the daemon writes to the blob store at
	// once: the others wait their turn, and answer too.
	held := map[string]string{}
	for i := range engine.DefaultBlobBodies + 4 {
		key := fmt.Sprintf("held-%d", i)
		a := shop.claim(t, key)
		if a.Status != http.StatusCreated {
			t.Fatalf("claim %s: %d %s", key, a.Status, a.Code)
		}
		held[key] = a.LeaseToken
	}
	large := randomBody(t, 256<<10)

	f.breaks(t)
	type timed struct {
		key  string
		a    tenantAnswer
		err  error
		took time.Duration
	}
	done := make(chan timed, len(held))
	for key, token := range held {
		go func() {
			start := time.Now()
			a, err := shop.do(http.MethodPost, "/v1/complete", completionOf(key, token, large))
			done <- timed{key, a, err, time.Since(start)}
		}()
	}
	// Meanwhile, small results are stored and replayed, the tenant's own and another's.
	for _, c := range []struct {
		who tenant
		key string
	}{{shop, "small-during"}, {other, "other-during"}} {
		body := []byte("small result of " + c.key)
		c.who.completes(t, c.key, body)
		if err := c.who.replays(t, c.key, body); err != nil {
			t.Fatal(err)
		}
	}
	var slowest time.Duration
	for range held {
		got := <-done
		if got.err != nil {
			t.Fatal(got.err)
		}
		if got.a.Status != http.StatusServiceUnavailable || got.a.Code != "store_unavailable" {
			t.Fatalf("a large completion of %s while the blob store fails: %d %q, want 503 store_unavailable", got.key, got.a.Status, got.a.Code)
		}
		slowest = max(slowest, got.took)
		if a := shop.lookup(t, got.key); a.Status != http.StatusOK || a.State != "pending" || a.Response != nil {
			t.Fatalf("the key of the refused completion %s: %d %q, state %q, response %v; want it pending, with no result", got.key, a.Status, a.Code, a.State, a.Response != nil)
		}
	}
	t.Logf("%d large completions at once answered 503, the last after %s", len(held), slowest.Round(time.Millisecond))
	if f.before {
		if a := shop.claim(t, "before"); a.Status != http.StatusServiceUnavailable || a.Response != nil {
			t.Fatalf("a replay of a large result while the blob store fails: %d %q, want 503 and no result", a.Status, a.Code)
		}
		if code, _, body := getRawAs(t, shop, "before"); code != http.StatusServiceUnavailable || bytes.Contains(body, acked["before"][:64]) {
			t.Fatalf("the raw GET of a large result while the blob store fails: %d, want 503 and none of its bytes", code)
		}
	}
	if a := other.claim(t, "other-during"); a.Status != http.StatusOK {
		t.Fatalf("another tenant's small replay while the blob store fails: %d %q", a.Status, a.Code)
	}

	f.heal(t)
	if f.before {
		if err := wait.Until(30*time.Second, func() error { return shop.replays(t, "before", acked["before"]) }); err != nil {
			t.Fatalf("once the blob store is back: %v", err)
		}
	}
	// The store may take a moment to answer writes again; the leases hold meanwhile.
	for key, token := range held {
		err := wait.Until(30*time.Second, func() error {
			if a := shop.complete(t, key, token, large); a.Status != http.StatusOK {
				return fmt.Errorf("the large completion of %s answered %d %s", key, a.Status, a.Code)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("once the blob store is back: %v", err)
		}
		acked[key] = large
	}
	acked["small-during"] = []byte("small result of small-during")
	for key, body := range acked {
		if err := shop.replays(t, key, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.replays(t, "other-during", []byte("small result of other-during")); err != nil {
		t.Fatal(err)
	}
}

func getRawAs(t *testing.T, c tenant, key string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base()+"/v1/keys/"+url.PathEscape(key)+"/result", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// relay runs netsplit.Relay in front of target on a loopback port that stays the same
// while its delay changes.
type relay struct {
	addr, target string
	stop         context.CancelFunc
	done         chan struct{}
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String(), target: target}
	r.run(ln, 0)
	t.Cleanup(r.close)
	return r
}

func (r *relay) run(ln net.Listener, delay time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		_ = netsplit.Relay(ctx, ln, r.target, delay, 0)
	}()
}

func (r *relay) close() {
	r.stop()
	<-r.done
}

// delay makes every stretch of bytes through the relay wait d from now on; the
// connections open are cut.
func (r *relay) delay(t *testing.T, d time.Duration) {
	t.Helper()
	r.close()
	var ln net.Listener
	err := wait.Until(10*time.Second, func() (err error) {
		ln, err = net.Listen("tcp", r.addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r.run(ln, d)
}

// TestLargeResultsThroughBlobStoreFaults runs the real binary, on Redis with its blobs
// in a real S3 server, through the S3 server paused (SIGSTOP), slowed past every
// deadline (a relay in front of it), and answering errors (a bucket it does not have
// until the fault heals: weed answers a PutObject 403 AccessDenied, a GetObject
// NoSuchBucket); and on the embedded store with a blob directory that cannot
// be used (a file in its place). Each goes through throughBlobFault.
func TestLargeResultsThroughBlobStoreFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon, Redis and an S3 server")
	}
	// Room for the volumes of the bucket made when the errors heal, besides Bucket's.
	s3srv := tests3.Start(t, "-volume.max=16")
	bin := buildDaemon(t)
	// A deadline short enough for the faults to pass it soon; the results are 256 KiB,
	// so each blob call gets 1.25 s.
	const timeout = "1s"
	daemon := func(t *testing.T, blobStore string, flags ...string) (shop, other tenant) {
		var p *process
		base := func() string { return p.base }
		auth, shop, other := twoTenants(t, base)
		p = startWith(t, bin, append(flags, "--blob-store", blobStore, "--store-timeout", timeout, "--auth-file", auth)...)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the daemon's log:\n%s", p.logs)
			}
		})
		return shop, other
	}

	t.Run("S3 paused", func(t *testing.T) {
		r := testredis.Start(t)
		shop, other := daemon(t, s3srv.URL("paused"), "--store", r.URL())
		t.Cleanup(s3srv.Resume)
		throughBlobFault(t, shop, other, blobFault{before: true,
			breaks: func(*testing.T) { s3srv.Pause() }, heal: func(*testing.T) { s3srv.Resume() }})
	})
	t.Run("S3 slowed past the deadline", func(t *testing.T) {
		r := testredis.Start(t)
		rl := startRelay(t, "127.0.0.1:"+strconv.Itoa(s3srv.Port))
		shop, other := daemon(t, tests3.URLOf("http://"+rl.addr, tests3.Bucket, "slowed"), "--store", r.URL())
		throughBlobFault(t, shop, other, blobFault{before: true,
			// Each way, so that every call's answer comes 6 s after it was sent.
			breaks: func(t *testing.T) { rl.delay(t, 3*time.Second) },
			heal:   func(t *testing.T) { rl.delay(t, 0) }})
	})
	t.Run("S3 answering errors", func(t *testing.T) {
		r := testredis.Start(t)
		bucket := "idemd-absent"
		shop, other := daemon(t, tests3.URLOf(s3srv.Endpoint(), bucket, "errors"), "--store", r.URL())
		throughBlobFault(t, shop, other, blobFault{before: false,
			breaks: func(*testing.T) {},
			heal: func(t *testing.T) {
				if err := s3srv.MakeBucket(bucket); err != nil {
					t.Fatal(err)
				}
			}})
	})
	t.Run("directory unusable", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "blobs")
		shop, other := daemon(t, "file://"+dir)
		away := dir + ".away"
		throughBlobFault(t, shop, other, blobFault{before: true,
			// Root may write anywhere, so the directory is not made read-only: a file
			// takes its place, and every path under it fails.
			breaks: func(t *testing.T) {
				if err := os.Rename(dir, away); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			heal: func(t *testing.T) {
				if err := os.Remove(dir); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(away, dir); err != nil {
					t.Fatal(err)
				}
			}})
	})
}
