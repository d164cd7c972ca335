package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// batchResult is one item's result as a test reads it.
type batchResult struct {
	Status   int            `json:"status"`
	Acquired map[string]any `json:"acquired"`
	Finished map[string]any `json:"finished"`
	Record   map[string]any `json:"record"`
	Extended map[string]any `json:"extended"`
	Problem  map[string]any `json:"problem"`
}

// members names the members of a result besides status, which must be exactly one.
func (r batchResult) members() []string {
	var names []string
	for name, set := range map[string]bool{"acquired": r.Acquired != nil, "finished": r.Finished != nil,
		"record": r.Record != nil, "extended": r.Extended != nil, "problem": r.Problem != nil} {
		if set {
			names = append(names, name)
		}
	}
	return names
}

// batch sends items as one batch and returns its results, failing unless the batch
// itself answers 200 with one result of exactly one member per item.
func (d *daemon) batch(items ...map[string]any) []batchResult {
	d.t.Helper()
	a := d.post("/v1/batch", map[string]any{"items": items})
	if a.status != http.StatusOK {
		d.t.Fatalf("batch: %d %s, want 200", a.status, a.raw)
	}
	var out struct {
		Results []batchResult `json:"results"`
	}
	if err := json.Unmarshal(a.raw, &out); err != nil {
		d.t.Fatal(err)
	}
	if len(out.Results) != len(items) {
		d.t.Fatalf("batch of %d items answered %d results: %s", len(items), len(out.Results), a.raw)
	}
	for i, r := range out.Results {
		if m := r.members(); len(m) != 1 {
			d.t.Fatalf("result %d has members %v besides status, want exactly one: %s", i, m, a.raw)
		}
	}
	return out.Results
}

func wantItem(t *testing.T, i int, r batchResult, status int, code string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("item %d: status %d, want %d: %+v", i, r.Status, status, r)
	}
	if code == "" {
		if r.Problem != nil {
			t.Fatalf("item %d: problem %v, want an answer", i, r.Problem)
		}
		return
	}
	if r.Problem == nil || r.Problem["code"] != code || r.Problem["status"] != float64(status) || r.Problem["title"] == "" {
		t.Fatalf("item %d: problem %v, want code %q status %d with a title", i, r.Problem, code, status)
	}
}

func op(name string, fields map[string]any) map[string]any { return map[string]any{name: fields} }

func TestBatch(t *testing.T) { forEachStore(t, testBatch) }

// testBatch checks that each item of a batch is answered as its single call would be,
// in the order of the items, and that items on one key run in their order.
func testBatch(t *testing.T, d *daemon) {
	k1, k2, k3 := freshKey("batch-1"), freshKey("batch-2"), freshKey("batch-3")
	done := d.acquire(k3)
	if a := d.complete(k3, done, 201, []byte(`{"id":3}`)); a.status != http.StatusOK {
		t.Fatalf("complete: %d %s", a.status, a.raw)
	}

	res := d.batch(
		op("claim", map[string]any{"key": k1, "fingerprint": "a"}),
		op("claim", map[string]any{"key": k1, "fingerprint": "b"}),
		op("claim", map[string]any{"key": k1, "fingerprint": "a"}),
		op("claim", map[string]any{"key": k2}),
		op("claim", map[string]any{"key": k3}),
		op("complete", map[string]any{"key": freshKey("nothing"), "lease_token": "t", "response": map[string]any{"status": 200}}),
		op("extend", map[string]any{"key": k2, "lease_token": "not-the-lease", "lease_ms": 5000}),
		op("extend", map[string]any{"key": k2, "lease_token": "t", "lease_ms": 5}),
		op("claim", map[string]any{"key": k2, "wait_ms": 100}),
	)
	wantItem(t, 0, res[0], http.StatusCreated, "")
	if res[0].Acquired["outcome"] != "acquired" || res[0].Acquired["lease_token"] == "" {
		t.Fatalf("item 0: %v, want an acquired lease", res[0].Acquired)
	}
	// The items on k1 ran in their order: the second and third saw the first's lease.
	wantItem(t, 1, res[1], http.StatusUnprocessableEntity, "fingerprint_mismatch")
	wantItem(t, 2, res[2], http.StatusConflict, "in_progress")
	if res[2].Problem["retry_after_ms"] == nil {
		t.Fatalf("item 2: in_progress without retry_after_ms: %v", res[2].Problem)
	}
	wantItem(t, 3, res[3], http.StatusCreated, "")
	wantItem(t, 4, res[4], http.StatusOK, "")
	if res[4].Finished["outcome"] != "completed" || res[4].Finished["response"].(map[string]any)["status"] != float64(201) {
		t.Fatalf("item 4: %v, want the stored 201 replayed", res[4].Finished)
	}
	wantItem(t, 5, res[5], http.StatusNotFound, "not_found")
	wantItem(t, 6, res[6], http.StatusConflict, "lease_lost")
	wantItem(t, 7, res[7], http.StatusBadRequest, "invalid_request")
	if detail, _ := res[7].Problem["detail"].(string); !strings.HasPrefix(detail, "items[7].extend.lease_ms ") {
		t.Fatalf("item 7: detail %q does not name items[7].extend.lease_ms", detail)
	}
	wantItem(t, 8, res[8], http.StatusBadRequest, "invalid_request")
	if detail, _ := res[8].Problem["detail"].(string); !strings.HasPrefix(detail, "items[8].claim.wait_ms ") {
		t.Fatalf("item 8: detail %q does not name items[8].claim.wait_ms", detail)
	}

	// A lease from a batch completes in the next one, and then replays.
	token := res[0].Acquired["lease_token"].(string)
	res = d.batch(
		op("complete", map[string]any{"key": k1, "lease_token": token, "response": map[string]any{"status": 202, "body": "eyJvayI6MX0="}}),
		op("extend", map[string]any{"key": k2, "lease_token": res[3].Acquired["lease_token"], "lease_ms": 60000}),
		op("release", map[string]any{"key": k2, "lease_token": res[3].Acquired["lease_token"], "mode": "retry"}),
		op("claim", map[string]any{"key": k1, "fingerprint": "a"}),
	)
	wantItem(t, 0, res[0], http.StatusOK, "")
	if res[0].Record["state"] != "completed" || res[0].Record["key"] != k1 {
		t.Fatalf("item 0: %v, want the completed record of %q", res[0].Record, k1)
	}
	wantItem(t, 1, res[1], http.StatusOK, "")
	if res[1].Extended["lease_expires_at"] == nil {
		t.Fatalf("item 1: %v, want the extended lease", res[1].Extended)
	}
	wantItem(t, 2, res[2], http.StatusOK, "")
	if res[2].Record["state"] != "released" {
		t.Fatalf("item 2: %v, want a released record", res[2].Record)
	}
	wantItem(t, 3, res[3], http.StatusOK, "")
	if resp := res[3].Finished["response"].(map[string]any); resp["status"] != float64(202) || resp["body"] != "eyJvayI6MX0=" {
		t.Fatalf("item 3: %v, want the stored 202 replayed", res[3].Finished)
	}
	if a := d.lookup(k2); a.str("state") != "released" || a.num("attempt") != 1 {
		t.Fatalf("lookup %q: %s, want released after attempt 1", k2, a.raw)
	}
}

func TestBatchRefusesMalformedBatches(t *testing.T) {
	forEachStore(t, testBatchRefusesMalformedBatches)
}

// testBatchRefusesMalformedBatches checks that a batch that is not well formed is
// refused whole, naming the member at fault, and changes nothing stored.
func testBatchRefusesMalformedBatches(t *testing.T, d *daemon) {
	key := freshKey("malformed")
	claim := op("claim", map[string]any{"key": key})
	tooMany := make([]map[string]any, server.MaxBatchItems+1)
	for i := range tooMany {
		tooMany[i] = op("claim", map[string]any{"key": fmt.Sprintf("%s-%d", key, i)})
	}
	for _, tc := range []struct {
		name, body, detail string
	}{
		{"no items", `{"items":[]}`, "items holds 0 operations"},
		{"items missing", `{}`, "items holds 0 operations"},
		{"too many items", mustJSON(t, map[string]any{"items": tooMany}), fmt.Sprintf("items holds %d operations", server.MaxBatchItems+1)},
		{"an item with two operations", mustJSON(t, map[string]any{"items": []any{claim,
			map[string]any{"claim": map[string]any{"key": key + "-x"}, "extend": map[string]any{"key": key, "lease_token": "t", "lease_ms": 1000}}}}),
			"items[1] holds 2 operations"},
		{"an item with none", mustJSON(t, map[string]any{"items": []any{claim, map[string]any{}}}), "items[1] holds 0 operations"},
		{"an unknown member in an item", mustJSON(t, map[string]any{"items": []any{claim, op("claim", map[string]any{"key": key, "colour": "red"})}}),
			`"items[1].claim.colour"`},
		{"an unknown operation", mustJSON(t, map[string]any{"items": []any{claim, map[string]any{"lookup": map[string]any{"key": key}}}}),
			`"items[1].lookup"`},
		{"a wrong type", `{"items":[{"claim":{"key":"` + key + `","lease_ms":"long"}}]}`, "items.claim.lease_ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := d.do(http.MethodPost, "/v1/batch", "application/json", []byte(tc.body))
			wantProblem(t, a, http.StatusBadRequest, a.str("code"))
			if code := a.str("code"); code != "invalid_request" && code != "invalid_json" {
				t.Fatalf("code %q, want invalid_request or invalid_json", code)
			}
			if !strings.Contains(a.str("detail"), tc.detail) {
				t.Fatalf("detail %q does not say %q", a.str("detail"), tc.detail)
			}
		})
	}
	if a := d.lookup(key); a.status != http.StatusNotFound {
		t.Fatalf("after refused batches, lookup %q: %d %s, want 404", key, a.status, a.raw)
	}
	if a := d.lookup(key + "-0"); a.status != http.StatusNotFound {
		t.Fatalf("after refused batches, lookup %q: %d %s, want 404", key+"-0", a.status, a.raw)
	}
	a := d.do(http.MethodPost, "/v1/batch", "text/plain", []byte(`{"items":[]}`))
	wantProblem(t, a, http.StatusUnsupportedMediaType, "unsupported_media_type")
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBatchStorm checks exactly-once acquisition when many batches claim the same
// keys at once: every key is acquired by exactly one item of all the batches.
func TestBatchStorm(t *testing.T) { forEachStore(t, testBatchStorm) }

func testBatchStorm(t *testing.T, d *daemon) {
	const keys, batches = 20, 30
	prefix := freshKey("batch-storm")
	acquired := make([][]int, batches)
	start := make(chan struct{})
	done := make(chan struct{}, batches)
	for b := range batches {
		go func() {
			defer func() { done <- struct{}{} }()
			items := make([]map[string]any, 0, keys)
			for k := range keys {
				// Each batch sends the keys in another order.
				items = append(items, op("claim", map[string]any{"key": fmt.Sprintf("%s-%d", prefix, (k+b)%keys)}))
			}
			<-start
			body := mustJSONNoT(map[string]any{"items": items})
			resp, err := http.Post(d.url+"/v1/batch", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out struct {
				Results []batchResult `json:"results"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Results) != keys {
				t.Errorf("batch %d: %d %s", b, resp.StatusCode, raw)
				return
			}
			for k, r := range out.Results {
				switch r.Status {
				case http.StatusCreated:
					acquired[b] = append(acquired[b], (k+b)%keys)
				case http.StatusConflict:
				default:
					t.Errorf("batch %d item %d: %+v, want 201 or 409", b, k, r)
				}
			}
		}()
	}
	close(start)
	for range batches {
		<-done
	}
	holders := make(map[int]int)
	for _, ks := range acquired {
		for _, k := range ks {
			holders[k]++
		}
	}
	for k := range keys {
		if holders[k] != 1 {
			t.Errorf("key %d acquired %d times, want once", k, holders[k])
		}
	}
}

func mustJSONNoT(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestBatchAuthentication checks that a batch is authenticated and scoped like its
// items' single calls, that its items work in the token's tenant, and that each item
// takes from the tenant's rate budget and is counted as its single call.
func TestBatchAuthentication(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	items := map[string]any{"items": []any{op("claim", map[string]any{"key": "k"})}}
	expectStatus(t, "no token", d.call("", http.MethodPost, "/v1/batch", items), http.StatusUnauthorized, "unauthenticated")
	expectStatus(t, "an admin-only token", d.call(alphaOnlyAdm, http.MethodPost, "/v1/batch", items), http.StatusForbidden, "forbidden")

	a := d.call(alphaUse, http.MethodPost, "/v1/batch", items)
	expectStatus(t, "alpha's batch", a, http.StatusOK, "")
	if got := d.call(betaUse, http.MethodGet, recordPath("k"), nil); got.status != http.StatusNotFound {
		t.Fatalf("beta sees alpha's batch-claimed key: %d %s", got.status, got.raw)
	}
	if got := d.call(alphaUse, http.MethodGet, recordPath("k"), nil); got.status != http.StatusOK || got.str("state") != "pending" {
		t.Fatalf("alpha's batch-claimed key: %d %s, want pending", got.status, got.raw)
	}

	// limited has a burst of three and earns one more every twenty seconds.
	five := make([]any, 5)
	for i := range five {
		five[i] = op("claim", map[string]any{"key": fmt.Sprintf("k%d", i)})
	}
	a = d.call(limitedUse, http.MethodPost, "/v1/batch", map[string]any{"items": five})
	expectStatus(t, "limited's batch of five", a, http.StatusOK, "")
	var out struct {
		Results []batchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(a.raw), &out); err != nil || len(out.Results) != 5 {
		t.Fatalf("limited's batch: %s", a.raw)
	}
	for i, r := range out.Results {
		if i < 3 {
			wantItem(t, i, r, http.StatusCreated, "")
		} else {
			wantItem(t, i, r, http.StatusTooManyRequests, "rate_limited")
		}
	}
	for i, want := range []string{":1", ":1", ":1", ":0", ":0"} {
		key := redisstore.RecordKey(engine.ID{Tenant: "limited", Key: fmt.Sprintf("k%d", i)})
		if n, err := d.redis.Command("EXISTS", key); err != nil || n != want {
			t.Fatalf("EXISTS of item %d's record: %q %v, want %s (a rate-limited item stores nothing)", i, n, err, want)
		}
	}
	metrics := d.metrics()
	for _, line := range []string{
		`idemd_requests_total{endpoint="POST /v1/batch",outcome="ok",tenant="limited"} 1`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="acquired",tenant="limited"} 3`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="rate_limited",tenant="limited"} 2`,
		`idemd_requests_total{endpoint="POST /v1/claim",outcome="acquired",tenant="alpha"} 1`,
	} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("metrics lack %s", line)
		}
	}
}

// TestBatchOnAFrozenStore: items on one key run one after the other, so against a
// frozen store a batch of many items on one key would hold its request for as many
// store deadlines. Once an item on a key finds the store unavailable, the later items
// on that key answer the same at once, unsent; items on other keys are not affected.
func TestBatchOnAFrozenStore(t *testing.T) {
	r, store := frozenRedis(t)
	var log lockedBuffer
	d := newDaemonWith(t, store, &log, engine.WithStoreTimeout(300*time.Millisecond))
	key, other := freshKey("frozen-batch"), freshKey("frozen-other")
	d.acquire(key + "-before")
	r.Pause()
	items := []map[string]any{op("claim", map[string]any{"key": other})}
	for range 5 {
		items = append(items, op("claim", map[string]any{"key": key}))
	}
	res := d.batch(items...)
	for i, r := range res {
		wantItem(t, i, r, http.StatusServiceUnavailable, "store_unavailable")
	}
	for i := range 2 {
		if detail, _ := res[i].Problem["detail"].(string); !strings.Contains(detail, "did not answer within 300ms") {
			t.Errorf("item %d: detail %q, want the store deadline", i, detail)
		}
	}
	for i := 2; i < len(res); i++ {
		if detail, _ := res[i].Problem["detail"].(string); !strings.Contains(detail, "not sent") {
			t.Errorf("item %d: detail %q, want it answered unsent after an earlier item on its key", i, detail)
		}
	}
	r.Resume()
	if err := testredis.WaitReady(r.Addr(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	d.acquire(freshKey("frozen-after"))
}
