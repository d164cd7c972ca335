package server_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
)

// TestMovedKeyAnswersStoreMoved: a key whose record a live move replaced with a marker
// in the daemon's Redis is 503 store_moved, with Retry-After, to every call on it:
// claims (resent, with the holder's secret, waiting), complete, release, extend,
// recovery point, lookup and purge; and the marker is as it was after all of them.
func TestMovedKeyAnswersStoreMoved(t *testing.T) {
	t.Parallel()
	d, r := redisDaemon(t)
	rc := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := context.Background()

	key := "moved-" + engine.NewLeaseToken()
	secret := "the holder's claim secret, long enough"
	a := d.claim(map[string]any{"key": key, "claim_secret": secret, "lease_ms": 60000})
	if a.status != 201 {
		t.Fatalf("claim: %d %s", a.status, a.raw)
	}
	tok := a.str("lease_token")
	rk := redisstore.RecordKey(engine.ID{Tenant: engine.DefaultTenant, Key: key})
	// The record as a moving marker, in the strings layout the daemon writes.
	now := time.Now().UnixMilli()
	if err := rc.Eval(ctx, `redis.call('SET', KEYS[1], cmsgpack.pack(2, ARGV[1], ARGV[2], 'm', nil, nil, 1,
		'old', nil, '0', tonumber(ARGV[3]), tonumber(ARGV[3]), tonumber(ARGV[3]) + 3600000), 'PX', 3600000) return 1`,
		[]string{rk}, key, engine.DefaultTenant, now).Err(); err != nil {
		t.Fatal(err)
	}
	before, err := rc.Dump(ctx, rk).Result()
	if err != nil {
		t.Fatal(err)
	}

	for _, call := range []struct {
		name string
		do   func() answer
	}{
		{"a new claim", func() answer { return d.claim(map[string]any{"key": key}) }},
		{"a claim with the holder's secret", func() answer {
			return d.claim(map[string]any{"key": key, "claim_secret": secret})
		}},
		{"a claim that waits", func() answer { return d.claim(map[string]any{"key": key, "wait_ms": 2000}) }},
		{"complete", func() answer { return d.complete(key, tok, 200, []byte("done")) }},
		{"release", func() answer {
			return d.post("/v1/release", map[string]any{"key": key, "lease_token": tok, "mode": "retry"})
		}},
		{"extend", func() answer {
			return d.post("/v1/extend", map[string]any{"key": key, "lease_token": tok, "lease_ms": 1000})
		}},
		{"recovery point", func() answer {
			return d.post("/v1/recovery-point", map[string]any{"key": key, "lease_token": tok, "name": "charged"})
		}},
		{"lookup", func() answer { return d.lookup(key) }},
		{"purge", func() answer { return d.do(http.MethodDelete, "/v1/records/"+url.PathEscape(key), "", nil) }},
	} {
		a := call.do()
		wantProblem(t, a, http.StatusServiceUnavailable, "store_moved")
		if a.header.Get("Retry-After") == "" || a.num("retry_after_ms") <= 0 {
			t.Errorf("%s: no Retry-After or retry_after_ms: %v %s", call.name, a.header, a.raw)
		}
		after, err := rc.Dump(ctx, rk).Result()
		if err != nil || after != before {
			t.Fatalf("%s changed the marker (%v)", call.name, err)
		}
	}
}
