package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// daemon is a real HTTP server over a real store.
type daemon struct {
	t   testing.TB
	url string
}

func newDaemon(t testing.TB, store engine.Store) *daemon {
	t.Helper()
	// A waiter here is woken by notifications alone (its own recheck comes after an
	// hour): a waiting claim that answers before its wait_ms ran out shows that the
	// store's notification woke it. The storms send a thousand claims at once to a
	// machine the race detector slows down; what they check is exactly-once
	// acquisition, so the store deadline is set well out of their way
	// (TestFrozenStoreAnswersAtItsDeadline tests the deadline).
	srv := server.New(engine.NewService(store, time.Hour, engine.Recheck(time.Hour), engine.WithStoreTimeout(time.Minute)), server.Config{
		Limits: server.Limits{MaxResponseBytes: 1024},
	})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &daemon{t: t, url: hs.URL}
}

func redisDaemon(t *testing.T) (*daemon, *testredis.Server) {
	t.Helper()
	r := testredis.Start(t)
	store, err := redisstore.Open(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return newDaemon(t, store), r
}

// forEachStore runs a test against a daemon over each store: the contract is the
// same whatever keeps the records. Each daemon and store is the test's own, so the
// test runs in parallel with others, and its two stores with each other.
func forEachStore(t *testing.T, test func(t *testing.T, d *daemon)) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		d, _ := redisDaemon(t)
		test(t, d)
	})
	t.Run("bolt", func(t *testing.T) {
		t.Parallel()
		store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		test(t, newDaemon(t, store))
	})
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

func (a answer) str(field string) string {
	s, _ := a.body[field].(string)
	return s
}

func (a answer) num(field string) int64 {
	f, _ := a.body[field].(float64)
	return int64(f)
}

func (d *daemon) do(method, path, contentType string, body []byte) answer {
	d.t.Helper()
	req, err := http.NewRequest(method, d.url+path, bytes.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: raw}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			d.t.Fatalf("%s %s: answer is not JSON: %q", method, path, raw)
		}
	}
	return a
}

func (d *daemon) post(path string, body any) answer {
	d.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		d.t.Fatal(err)
	}
	return d.do(http.MethodPost, path, "application/json", b)
}

func (d *daemon) claim(fields map[string]any) answer {
	d.t.Helper()
	return d.post("/v1/claim", fields)
}

func (d *daemon) acquire(key string, extra ...any) string {
	d.t.Helper()
	fields := map[string]any{"key": key}
	for i := 0; i+1 < len(extra); i += 2 {
		fields[extra[i].(string)] = extra[i+1]
	}
	a := d.claim(fields)
	if a.status != http.StatusCreated || a.str("outcome") != "acquired" {
		d.t.Fatalf("claim %q: %d %s, want 201 acquired", key, a.status, a.raw)
	}
	return a.str("lease_token")
}

func (d *daemon) complete(key, token string, status int, body []byte) answer {
	d.t.Helper()
	response := map[string]any{"status": status, "headers": map[string][]string{"Content-Type": {"application/json"}}}
	if body != nil {
		response["body"] = body
	}
	return d.post("/v1/complete", map[string]any{"key": key, "lease_token": token, "response": response})
}

func (d *daemon) lookup(key string) answer {
	d.t.Helper()
	return d.do(http.MethodGet, "/v1/records/"+url.PathEscape(key), "", nil)
}

var keySeq atomic.Int64

func freshKey(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), keySeq.Add(1))
}

func wantProblem(t *testing.T, a answer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d: %s", a.status, status, a.raw)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	if a.str("code") != code || a.num("status") != int64(status) || a.str("title") == "" || a.str("type") == "" {
		t.Fatalf("problem %s, want code %q status %d with type and title", a.raw, code, status)
	}
}

func TestContract(t *testing.T) { forEachStore(t, testContract) }

func testContract(t *testing.T, d *daemon) {
	tests := []struct {
		name string
		run  func(t *testing.T, key string)
	}{
		{"unseen key acquires with 201 and attempt 1", func(t *testing.T, key string) {
			before := time.Now()
			a := d.claim(map[string]any{"key": key, "lease_ms": 5000})
			if a.status != 201 || a.str("outcome") != "acquired" || a.num("attempt") != 1 || a.body["recovered"] != false || len(a.str("lease_token")) != 32 {
				t.Fatalf("got %d %s", a.status, a.raw)
			}
			exp, err := time.Parse(time.RFC3339Nano, a.str("lease_expires_at"))
			if err != nil || !between(exp, before.Add(5*time.Second), time.Now().Add(5*time.Second)) {
				t.Fatalf("lease_expires_at %q, want 5s after the claim", a.str("lease_expires_at"))
			}
		}},
		{"held key is 409 in_progress with Retry-After", func(t *testing.T, key string) {
			start := time.Now()
			d.acquire(key, "lease_ms", 20000)
			a := d.claim(map[string]any{"key": key})
			// The lease ran for at most this long before the second claim looked at it.
			ran := time.Since(start)
			wantProblem(t, a, 409, "in_progress")
			left := 20*time.Second - ran
			if ra, _ := strconv.Atoi(a.header.Get("Retry-After")); ra > 20 || time.Duration(ra)*time.Second < left-time.Millisecond {
				t.Fatalf("Retry-After %q, want the %s left rounded up to seconds", a.header.Get("Retry-After"), left)
			}
			if ms := a.num("retry_after_ms"); ms > 20000 || ms < left.Milliseconds()-1 {
				t.Fatalf("retry_after_ms %d, want at most 20000 and at least the %s left", ms, left)
			}
		}},
		{"a resent claim with its claim_secret gets its lease back; an owner name grants nothing", func(t *testing.T, key string) {
			secret := "0123456789abcdef0123456789abcdef"
			tok := d.acquire(key, "owner", "worker-1", "claim_secret", secret)
			if again := d.acquire(key, "owner", "worker-2", "claim_secret", secret); again != tok {
				t.Fatalf("resent claim token %q, want %q", again, tok)
			}
			wantProblem(t, d.claim(map[string]any{"key": key, "owner": "worker-1"}), 409, "in_progress")
			wantProblem(t, d.claim(map[string]any{"key": key, "owner": "worker-1", "claim_secret": "another-secret-of-32-characters!"}), 409, "in_progress")
			if a := d.lookup(key); strings.Contains(string(a.raw), secret) || a.body["claim_secret"] != nil {
				t.Fatalf("lookup shows the claim secret: %s", a.raw)
			}
		}},
		{"claim answers carry expires_at and the fields of their status", func(t *testing.T, key string) {
			a := d.claim(map[string]any{"key": key})
			if a.status != 201 || a.str("outcome") != "acquired" || a.str("lease_token") == "" || a.str("lease_expires_at") == "" || a.str("expires_at") == "" || a.body["recovered"] != false || a.num("attempt") != 1 {
				t.Fatalf("acquired: %d %s", a.status, a.raw)
			}
			x := d.post("/v1/extend", map[string]any{"key": key, "lease_token": a.str("lease_token"), "lease_ms": 1000})
			if x.status != 200 || x.str("expires_at") == "" || x.str("lease_expires_at") == "" {
				t.Fatalf("extend: %d %s", x.status, x.raw)
			}
			d.complete(key, a.str("lease_token"), 201, []byte("ok"))
			f := d.claim(map[string]any{"key": key})
			if f.status != 200 || f.str("outcome") != "completed" || f.str("expires_at") == "" || f.body["lease_token"] != nil || f.num("attempt") != 1 {
				t.Fatalf("finished: %d %s", f.status, f.raw)
			}
		}},
		{"completed key replays byte for byte with 200", func(t *testing.T, key string) {
			tok := d.acquire(key, "fingerprint", "fp1")
			body := []byte("\x00\x01{\"id\":42}\xff")
			if a := d.complete(key, tok, 201, body); a.status != 200 || a.str("state") != "completed" {
				t.Fatalf("complete: %d %s", a.status, a.raw)
			}
			a := d.claim(map[string]any{"key": key, "fingerprint": "fp1"})
			resp, _ := a.body["response"].(map[string]any)
			if a.status != 200 || a.str("outcome") != "completed" || resp == nil {
				t.Fatalf("replay: %d %s", a.status, a.raw)
			}
			got, _ := base64.StdEncoding.DecodeString(resp["body"].(string))
			if !bytes.Equal(got, body) || resp["status"].(float64) != 201 || fmt.Sprint(resp["headers"]) != "map[Content-Type:[application/json]]" {
				t.Fatalf("replayed %v, want status 201, the header and body %q", resp, body)
			}
		}},
		{"failed key replays the failure with 200", func(t *testing.T, key string) {
			tok := d.acquire(key)
			a := d.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "fail",
				"response": map[string]any{"status": 402, "body": []byte("declined")}})
			if a.status != 200 || a.str("state") != "failed" {
				t.Fatalf("release fail: %d %s", a.status, a.raw)
			}
			a = d.claim(map[string]any{"key": key})
			resp, _ := a.body["response"].(map[string]any)
			if a.status != 200 || a.str("outcome") != "failed" || resp["status"].(float64) != 402 {
				t.Fatalf("claim after fail: %d %s", a.status, a.raw)
			}
		}},
		{"release retry lets the next claim acquire attempt 2", func(t *testing.T, key string) {
			tok := d.acquire(key)
			if a := d.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "retry"}); a.status != 200 || a.str("state") != "released" {
				t.Fatalf("release retry: %d %s", a.status, a.raw)
			}
			a := d.claim(map[string]any{"key": key})
			if a.status != 201 || a.num("attempt") != 2 || a.body["recovered"] != false {
				t.Fatalf("claim after retry: %d %s", a.status, a.raw)
			}
		}},
		{"different fingerprint is 422 on pending and completed keys", func(t *testing.T, key string) {
			tok := d.acquire(key, "fingerprint", "A")
			wantProblem(t, d.claim(map[string]any{"key": key, "fingerprint": "B"}), 422, "fingerprint_mismatch")
			d.complete(key, tok, 200, nil)
			wantProblem(t, d.claim(map[string]any{"key": key, "fingerprint": "B"}), 422, "fingerprint_mismatch")
		}},
		{"repeated complete is 200 again", func(t *testing.T, key string) {
			tok := d.acquire(key)
			for i := range 3 {
				if a := d.complete(key, tok, 200, []byte("x")); a.status != 200 {
					t.Fatalf("complete #%d: %d %s", i, a.status, a.raw)
				}
			}
		}},
		{"complete with a wrong token is 409 lease_lost", func(t *testing.T, key string) {
			d.acquire(key)
			wantProblem(t, d.complete(key, engine.NewLeaseToken(), 200, nil), 409, "lease_lost")
		}},
		{"complete on a missing key is 404 not_found", func(t *testing.T, key string) {
			wantProblem(t, d.complete(key, engine.NewLeaseToken(), 200, nil), 404, "not_found")
		}},
		{"extend renews a live lease", func(t *testing.T, key string) {
			tok := d.acquire(key, "lease_ms", 1000)
			before := time.Now()
			a := d.post("/v1/extend", map[string]any{"key": key, "lease_token": tok, "lease_ms": 60000})
			exp, err := time.Parse(time.RFC3339Nano, a.str("lease_expires_at"))
			if a.status != 200 || err != nil || !between(exp, before.Add(time.Minute), time.Now().Add(time.Minute)) {
				t.Fatalf("extend: %d %s", a.status, a.raw)
			}
			wantProblem(t, d.post("/v1/extend", map[string]any{"key": key, "lease_token": "nope", "lease_ms": 1000}), 409, "lease_lost")
		}},
		{"lookup shows the record, purge removes it", func(t *testing.T, key string) {
			tok := d.acquire(key, "owner", "o", "fingerprint", "f")
			a := d.lookup(key)
			if a.status != 200 || a.str("key") != key || a.str("state") != "pending" || a.str("owner") != "o" || a.str("fingerprint") != "f" || a.str("lease_expires_at") == "" {
				t.Fatalf("lookup pending: %d %s", a.status, a.raw)
			}
			if _, leaked := a.body["lease_token"]; leaked {
				t.Fatalf("lookup shows the lease token: %s", a.raw)
			}
			d.complete(key, tok, 204, nil)
			if a := d.lookup(key); a.str("state") != "completed" || a.body["response"] == nil {
				t.Fatalf("lookup completed: %s", a.raw)
			}
			if a := d.do(http.MethodDelete, "/v1/records/"+url.PathEscape(key), "", nil); a.status != 204 {
				t.Fatalf("purge: %d %s", a.status, a.raw)
			}
			wantProblem(t, d.lookup(key), 404, "not_found")
			wantProblem(t, d.do(http.MethodDelete, "/v1/records/"+url.PathEscape(key), "", nil), 404, "not_found")
		}},
		{"keys with /, ?, #, %, spaces and UTF-8 round-trip through the path", func(t *testing.T, key string) {
			for _, k := range []string{key + "/a?b#c d", key + "%2F%25", key + "日本/ü"} {
				d.acquire(k)
				if a := d.lookup(k); a.status != 200 || a.str("key") != k {
					t.Fatalf("lookup %q: %d %s", k, a.status, a.raw)
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, freshKey("contract"))
		})
	}
}

func TestBadInputChangesNothing(t *testing.T) { forEachStore(t, testBadInputChangesNothing) }

func testBadInputChangesNothing(t *testing.T, d *daemon) {
	key := freshKey("bad")
	tok := d.acquire(key, "fingerprint", "orig", "lease_ms", 60000)
	before := d.lookup(key).raw
	long := strings.Repeat("k", 256)

	tests := []struct {
		name, path, contentType, body string
		status                        int
		code, detail                  string
	}{
		{"malformed JSON", "/v1/claim", "application/json", `{"key":`, 400, "invalid_json", "malformed"},
		{"empty body", "/v1/claim", "application/json", ``, 400, "invalid_json", "empty"},
		{"not an object", "/v1/claim", "application/json", `[1,2]`, 400, "invalid_request", "object"},
		{"trailing data", "/v1/claim", "application/json", `{"key":"a"} {}`, 400, "invalid_json", "after"},
		{"unknown field", "/v1/claim", "application/json", `{"key":"a","keyy":1}`, 400, "invalid_request", "keyy"},
		{"wrong type", "/v1/claim", "application/json", `{"key":5}`, 400, "invalid_request", "key"},
		{"missing key", "/v1/claim", "application/json", `{}`, 400, "invalid_request", "key"},
		{"key too long", "/v1/claim", "application/json", `{"key":"` + long + `"}`, 400, "invalid_request", "key"},
		{"key not UTF-8", "/v1/claim", "application/json", "{\"key\":\"\xff\xfe\"}", 400, "invalid_json", "UTF-8"},
		{"lease_ms too small", "/v1/claim", "application/json", `{"key":"a","lease_ms":99}`, 400, "invalid_request", "lease_ms"},
		{"lease_ms too large", "/v1/claim", "application/json", `{"key":"a","lease_ms":3600001}`, 400, "invalid_request", "lease_ms"},
		{"lease_ms fractional", "/v1/claim", "application/json", `{"key":"a","lease_ms":1.5}`, 400, "invalid_request", "lease_ms"},
		{"wait_ms too large", "/v1/claim", "application/json", `{"key":"a","wait_ms":30001}`, 400, "invalid_request", "wait_ms"},
		{"wait_ms negative", "/v1/claim", "application/json", `{"key":"a","wait_ms":-1}`, 400, "invalid_request", "wait_ms"},
		{"fingerprint too long", "/v1/claim", "application/json", `{"key":"a","fingerprint":"` + strings.Repeat("f", 257) + `"}`, 400, "invalid_request", "fingerprint"},
		{"claim_secret too short", "/v1/claim", "application/json", `{"key":"a","claim_secret":"short"}`, 400, "invalid_request", "claim_secret"},
		{"owner too long", "/v1/claim", "application/json", `{"key":"a","owner":"` + strings.Repeat("o", 257) + `"}`, 400, "invalid_request", "owner"},
		{"wrong content type", "/v1/claim", "text/plain", `{"key":"a"}`, 415, "unsupported_media_type", "Content-Type"},
		{"no content type", "/v1/claim", "", `{"key":"a"}`, 415, "unsupported_media_type", "Content-Type"},
		{"complete: invalid base64", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","response":{"status":200,"body":"%%%"}}`, 400, "invalid_request", "response.body"},
		{"complete: status out of range", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","response":{"status":600}}`, 400, "invalid_request", "response.status"},
		{"complete: missing response", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `"}`, 400, "invalid_request", "response.status"},
		{"complete: missing token", "/v1/complete", "application/json", `{"key":"` + key + `","response":{"status":200}}`, 400, "invalid_request", "lease_token"},
		{"complete: retention too long", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","response":{"status":200},"retention_ms":2592000001}`, 400, "invalid_request", "retention_ms"},
		{"complete: retention zero", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","response":{"status":200},"retention_ms":0}`, 400, "invalid_request", "retention_ms"},
		{"complete: response over the limit", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","response":{"status":200,"body":"` + base64.StdEncoding.EncodeToString(make([]byte, 1025)) + `"}}`, 413, "payload_too_large", "response"},
		{"complete: unknown field in response", "/v1/complete", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","response":{"status":200,"extra":1}}`, 400, "invalid_request", "extra"},
		{"release: bad mode", "/v1/release", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","mode":"later"}`, 400, "invalid_request", "mode"},
		{"release: retry with a response", "/v1/release", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","mode":"retry","response":{"status":500}}`, 400, "invalid_request", "response"},
		{"extend: missing lease_ms", "/v1/extend", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `"}`, 400, "invalid_request", "lease_ms"},
		{"recovery point: missing name", "/v1/recovery-point", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `"}`, 400, "invalid_request", "name"},
		{"recovery point: name too long", "/v1/recovery-point", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","name":"` + strings.Repeat("n", 129) + `"}`, 400, "invalid_request", "name"},
		{"recovery point: invalid base64", "/v1/recovery-point", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","name":"charged","data":"%%%"}`, 400, "invalid_request", "data"},
		{"recovery point: data over the limit", "/v1/recovery-point", "application/json", `{"key":"` + key + `","lease_token":"` + tok + `","name":"charged","data":"` + base64.StdEncoding.EncodeToString(make([]byte, engine.DefaultMaxPointBytes+1)) + `"}`, 413, "payload_too_large", "data"},
		{"recovery point: missing token", "/v1/recovery-point", "application/json", `{"key":"` + key + `","name":"charged"}`, 400, "invalid_request", "lease_token"},
		{"body far over the limit", "/v1/claim", "application/json", `{"key":"` + strings.Repeat("a", 1<<20) + `"}`, 413, "payload_too_large", "bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := d.do(http.MethodPost, tc.path, tc.contentType, []byte(tc.body))
			wantProblem(t, a, tc.status, tc.code)
			if !strings.Contains(a.str("detail"), tc.detail) {
				t.Fatalf("detail %q does not name %q", a.str("detail"), tc.detail)
			}
			if after := d.lookup(key).raw; !bytes.Equal(after, before) {
				t.Fatalf("bad input changed the record:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	t.Run("lookup of an over-long key", func(t *testing.T) {
		wantProblem(t, d.lookup(long), 400, "invalid_request")
	})
	t.Run("lookup of a non-UTF-8 key", func(t *testing.T) {
		wantProblem(t, d.do(http.MethodGet, "/v1/records/%FF", "", nil), 400, "invalid_request")
	})
	t.Run("unknown route", func(t *testing.T) {
		wantProblem(t, d.do(http.MethodGet, "/v2/nothing", "", nil), 404, "not_found")
	})
	t.Run("wrong method", func(t *testing.T) {
		wantProblem(t, d.do(http.MethodGet, "/v1/claim", "", nil), 405, "method_not_allowed")
	})
}

func TestTakeoverAfterExpiry(t *testing.T) { forEachStore(t, testTakeoverAfterExpiry) }

func testTakeoverAfterExpiry(t *testing.T, d *daemon) {
	key := freshKey("takeover")
	old := d.acquire(key, "lease_ms", 100)
	var a answer
	wait.For(t, 10*time.Second, "a claim to take the expired lease over", func() bool {
		a = d.claim(map[string]any{"key": key})
		return a.status != 409
	})
	if a.status != 201 || a.body["recovered"] != true || a.num("attempt") != 2 {
		t.Fatalf("takeover: %d %s", a.status, a.raw)
	}
	waitForMetric(t, d, `idemd_lease_takeovers_total{tenant="default"} 1`)
	wantProblem(t, d.complete(key, old, 200, nil), 409, "lease_lost")
	if c := d.complete(key, a.str("lease_token"), 200, nil); c.status != 200 {
		t.Fatalf("new holder's complete: %d %s", c.status, c.raw)
	}
}

func TestRecoveryPoints(t *testing.T) { forEachStore(t, testRecoveryPoints) }

// testRecoveryPoints follows a recovery point through a key's life: recorded by the
// holder, shown by lookup, refused to a stale token, handed to the holder that takes
// the key over and to the one that claims it after a release, and dropped when the key
// completes.
func testRecoveryPoints(t *testing.T, d *daemon) {
	key := freshKey("point")
	first := d.acquire(key, "lease_ms", 100)
	point := func(tok, name string, data []byte) answer {
		return d.post("/v1/recovery-point", map[string]any{"key": key, "lease_token": tok, "name": name,
			"data": base64.StdEncoding.EncodeToString(data)})
	}
	wantPoint := func(what string, body map[string]any, name string, data []byte, attempt int64) {
		t.Helper()
		p, _ := body["recovery_point"].(map[string]any)
		got, _ := base64.StdEncoding.DecodeString(fmt.Sprint(p["data"]))
		if p == nil || p["name"] != name || !bytes.Equal(got, data) || p["attempt"] != float64(attempt) || p["recorded_at"] == nil {
			t.Fatalf("%s: recovery point %v, want %q with %q by attempt %d", what, body["recovery_point"], name, data, attempt)
		}
	}
	if a := point(first, "charged", []byte("ch_1\x00")); a.status != 200 {
		t.Fatalf("recording a recovery point: %d %s", a.status, a.raw)
	} else {
		wantPoint("its answer", a.body, "charged", []byte("ch_1\x00"), 1)
	}
	wantPoint("lookup", d.lookup(key).body, "charged", []byte("ch_1\x00"), 1)

	var second answer
	wait.For(t, 10*time.Second, "a claim to take the expired lease over", func() bool {
		second = d.claim(map[string]any{"key": key, "lease_ms": 60000})
		return second.status != 409
	})
	if second.status != 201 || second.body["recovered"] != true {
		t.Fatalf("takeover: %d %s", second.status, second.raw)
	}
	wantPoint("the takeover's answer", second.body, "charged", []byte("ch_1\x00"), 1)
	before := d.lookup(key).raw
	wantProblem(t, point(first, "stale", nil), 409, "lease_lost")
	if after := d.lookup(key).raw; !bytes.Equal(after, before) {
		t.Fatalf("a stale token's recovery point changed the record:\nbefore %s\nafter  %s", before, after)
	}

	tok := second.str("lease_token")
	if a := point(tok, "published", nil); a.status != 200 {
		t.Fatalf("recording a second recovery point: %d %s", a.status, a.raw)
	}
	if a := d.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "retry"}); a.status != 200 {
		t.Fatalf("release: %d %s", a.status, a.raw)
	}
	third := d.claim(map[string]any{"key": key})
	if third.status != 201 || third.body["recovered"] != false || third.num("attempt") != 3 {
		t.Fatalf("claim after the release: %d %s", third.status, third.raw)
	}
	wantPoint("the claim after a release", third.body, "published", nil, 2)
	if c := d.complete(key, third.str("lease_token"), 200, nil); c.status != 200 {
		t.Fatalf("complete: %d %s", c.status, c.raw)
	}
	if l := d.lookup(key); l.body["recovery_point"] != nil {
		t.Fatalf("a completed key keeps its recovery point: %s", l.raw)
	}
	wantProblem(t, point(third.str("lease_token"), "late", nil), 409, "lease_lost")
}

func TestWaitForCompletion(t *testing.T) { forEachStore(t, testWaitForCompletion) }

func testWaitForCompletion(t *testing.T, d *daemon) {
	key := freshKey("wait")
	tok := d.acquire(key, "lease_ms", 60000)

	waited := make(chan answer, 1)
	go func() { waited <- d.claim(map[string]any{"key": key, "wait_ms": 30000}) }()
	// The waiter is counted once it is waiting; complete only then, so the test shows a
	// wake-up rather than a lucky first look. The wait is the longest allowed and the
	// lease outlasts it: a notification late on a loaded machine still lands within
	// it, and a lost one still ends in 409.
	waitForMetric(t, d, "idemd_claim_waiters 1")
	d.complete(key, tok, 200, []byte("done"))
	// Without the notification the waiter would answer 409 when its wait ran out.
	if a := <-waited; a.status != 200 || a.str("outcome") != "completed" {
		t.Fatalf("waiter: %d %s, want woken by the completion", a.status, a.raw)
	}
}

func TestWaitTimesOutInProgress(t *testing.T) { forEachStore(t, testWaitTimesOutInProgress) }

func testWaitTimesOutInProgress(t *testing.T, d *daemon) {
	key := freshKey("wait-timeout")
	d.acquire(key, "lease_ms", 20000)
	start := time.Now()
	a := d.claim(map[string]any{"key": key, "wait_ms": 300})
	wantProblem(t, a, 409, "in_progress")
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("answered after %s, before wait_ms ran out", el)
	}
}

func TestWaitAcquiresAfterRelease(t *testing.T) { forEachStore(t, testWaitAcquiresAfterRelease) }

func testWaitAcquiresAfterRelease(t *testing.T, d *daemon) {
	key := freshKey("wait-release")
	tok := d.acquire(key, "lease_ms", 60000)
	waited := make(chan answer, 1)
	go func() { waited <- d.claim(map[string]any{"key": key, "wait_ms": 30000}) }()
	waitForMetric(t, d, "idemd_claim_waiters 1")
	d.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "retry"})
	if a := <-waited; a.status != 201 || a.num("attempt") != 2 {
		t.Fatalf("waiter after release: %d %s", a.status, a.raw)
	}
}

func waitForMetric(t testing.TB, d *daemon, line string) {
	t.Helper()
	wait.For(t, 30*time.Second, "the metric line "+line, func() bool {
		resp, err := http.Get(d.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), line+"\n")
	})
}

// between says whether t is within [from, to], allowing for the store's clock, which
// counts whole milliseconds.
func between(t, from, to time.Time) bool {
	return !t.Before(from.Add(-time.Millisecond)) && !t.After(to)
}

// TestStorm has 200 keys (40 under -short) claimed by 50 simultaneous claimers each
// over HTTP: every key must be acquired exactly once.
func TestStorm(t *testing.T) { forEachStore(t, testStorm) }

func testStorm(t *testing.T, d *daemon) {
	keys := 200
	if testing.Short() {
		keys = 40
	}
	storm(t, []*daemon{d}, keys, 50)
}

// storm has claimers race for each of keys keys, spread over the daemons: every key
// must be acquired exactly once and every other claim must hear 409. Keys go in
// waves of 20; within a wave all claims of every key are sent at once.
func storm(t *testing.T, ds []*daemon, keys, claimers int) {
	const wave = 20
	prefix := freshKey("storm")
	p := newPoster()
	acquired := make([]atomic.Int32, keys)
	var other atomic.Int32
	for w := 0; w < keys; w += wave {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for k := w; k < min(w+wave, keys); k++ {
			for c := range claimers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					d := ds[(k+c)%len(ds)]
					switch code, _ := p.post(d.url, "/v1/claim", fmt.Sprintf(`{"key":"%s-%d","owner":"c%d"}`, prefix, k, c)); code {
					case 201:
						acquired[k].Add(1)
					case 409:
					default:
						other.Add(1)
					}
				}()
			}
		}
		close(start)
		wg.Wait()
	}
	if n := other.Load(); n != 0 {
		t.Errorf("%d claims answered neither 201 nor 409", n)
	}
	for k := range keys {
		if n := acquired[k].Load(); n != 1 {
			t.Errorf("key %d acquired %d times, want exactly once", k, n)
		}
	}
}

// TestFailClosed stops Redis under a running daemon: claims must answer 503 with
// Retry-After, never "acquired", and the daemon must recover by itself.
func TestFailClosed(t *testing.T) {
	t.Parallel()
	d, r := redisDaemon(t)
	key := freshKey("closed")
	d.acquire(key + "-before")
	r.Stop()
	a := d.claim(map[string]any{"key": key})
	wantProblem(t, a, 503, "store_unavailable")
	if a.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	wantProblem(t, d.do(http.MethodGet, "/readyz", "", nil), 503, "store_unavailable")
	if h := d.do(http.MethodGet, "/healthz", "", nil); h.status != 200 {
		t.Fatalf("healthz while Redis is down: %d", h.status)
	}
	r.Restart()
	wait.For(t, 20*time.Second, "the daemon to reach Redis again", func() bool {
		a = d.claim(map[string]any{"key": key})
		return a.status != 503
	})
	if a.status != 201 {
		t.Fatalf("after Redis came back: %d %s", a.status, a.raw)
	}
	// A ping may meet a connection of the pool that died with the old process before
	// the pool drops it, as a claim may: readiness comes back by itself all the same.
	wait.For(t, 20*time.Second, "readyz to answer 200 after recovery", func() bool {
		return d.do(http.MethodGet, "/readyz", "", nil).status == 200
	})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	d, _ := redisDaemon(t)
	key := freshKey("metrics")
	d.acquire(key)
	d.claim(map[string]any{"key": key})
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="acquired",tenant="default"} 1`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="in_progress",tenant="default"} 1`,
		`idemd_request_duration_seconds_count{endpoint="POST /v1/claim"} 2`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestClaimHonoursCancellation(t *testing.T) {
	t.Parallel()
	d, _ := redisDaemon(t)
	key := freshKey("cancel")
	d.acquire(key, "lease_ms", 60000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/claim",
		strings.NewReader(`{"key":"`+key+`","wait_ms":30000}`))
	req.Header.Set("Content-Type", "application/json")
	sent := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		sent <- err
	}()
	waitForMetric(t, d, "idemd_claim_waiters 1")
	cancel()
	if err := <-sent; err == nil {
		t.Fatal("request outlived its context")
	}
	// The daemon notices the client went away and lets the waiter go, long before its
	// 30 s wait would have run out.
	waitForMetric(t, d, "idemd_claim_waiters 0")
}
