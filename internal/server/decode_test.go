package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/engine"
)

// FuzzDecodeClaim drives the strict decoder and the claim validation with arbitrary
// bodies: they must never panic, must answer every refusal as a 4xx problem with a
// detail, and must only accept requests inside the contract's limits.
func FuzzDecodeClaim(f *testing.F) {
	for _, seed := range []string{
		`{"key":"a"}`,
		`{"key":"a/b?c#d","fingerprint":"f","owner":"o","lease_ms":100,"wait_ms":30000}`,
		`{"key":""}`, `{"key":5}`, `{"key":"a","extra":1}`, `{"key":"a"} {}`, `[]`, `null`, ``,
		"{\"key\":\"\xff\"}", `{"key":"\ud800"}`, `{"key":"a","lease_ms":1e3}`, `{"key":"a","lease_ms":-1}`,
		`{"key":"a","wait_ms":9223372036854775807}`, `{"key":"a","lease_ms":99999999999999999999}`,
		`{"key":"a","key":"b"}`, `{"KEY":"a"}`, `{"key":"a","Lease_ms":500}`, `{"key":"\udc00"}`,
		`{"key":"\ud83d\ude00"}`, `{"key":"\\ud800"}`, `{"key":"\ud800\u0041"}`,
		`{"key":"a","wait_ms":null}`, `{"key":null}`, `{"key":"null","owner":"null"}`,
	} {
		f.Add([]byte(seed))
	}
	s := &Server{limits: Limits{MaxResponseBytes: 1024}}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r api.ClaimRequest
		err := decodeBody(body, &r)
		var req engine.ClaimRequest
		if err == nil {
			req, err = s.claimRequest(engine.DefaultTenant, r)
		}
		if err != nil {
			checkRefusal(t, err)
			return
		}
		noNull(t, body)
		// A U+FFFD in an accepted key was sent as one, never made from a lone surrogate.
		if strings.ContainsRune(req.ID.Key, utf8.RuneError) && !bytes.Contains(body, []byte("\uFFFD")) &&
			!bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
			t.Fatalf("accepted key %q from %q", req.ID.Key, body)
		}
		if len(req.ID.Key) == 0 || len(req.ID.Key) > engine.MaxKeyBytes {
			t.Fatalf("accepted key of %d bytes", len(req.ID.Key))
		}
		if req.Lease < engine.MinLease || req.Lease > engine.MaxLease || req.Wait < 0 || req.Wait > engine.MaxWait {
			t.Fatalf("accepted lease %s wait %s", req.Lease, req.Wait)
		}
	})
}

// FuzzDecodeComplete does the same for completions, whose body carries base64 and a
// header map.
func FuzzDecodeComplete(f *testing.F) {
	for _, seed := range []string{
		`{"key":"a","lease_token":"t","response":{"status":200}}`,
		`{"key":"a","lease_token":"t","response":{"status":201,"headers":{"A":["1","2"]},"body":"AAEC"},"retention_ms":1}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"body":"%%"}}`,
		`{"key":"a","lease_token":"t","response":{"status":99}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"":["x"]}}}`,
		`{"key":"a","lease_token":"t","response":null}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"body":"QUFB"},"retention_ms":2592000001}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"X":["a\r\nb"]}}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"Transfer-Encoding":["chunked"]}}}`,
		`{"key":"a","lease_token":"t","response":{"status":101}}`,
		`{"key":"a","lease_token":"t","response":{"status":204,"body":"QQ=="}}`,
		`{"key":"a","lease_token":"t","response":{"status":204,"sealed":"wQECazFaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlo="}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"sealed":"wQECazE=","body":""}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"Idemd-Sealed":["1"]},"body":"QQ=="}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"idemd-blob":["x 1 ab"]}}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"A":null}}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"headers":{"A":["1",null]}}}`,
		`{"key":"a","lease_token":"t","response":{"status":200,"body":null},"retention_ms":null}`,
	} {
		f.Add([]byte(seed))
	}
	s := &Server{limits: Limits{MaxResponseBytes: 64}}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r api.CompleteRequest
		err := decodeBody(body, &r)
		var c engine.Completion
		if err == nil {
			c, err = s.completion(engine.DefaultTenant, r)
		}
		if err != nil {
			checkRefusal(t, err)
			return
		}
		noNull(t, body)
		if c.Response.Status < 200 || c.Response.Status > 599 || c.Response.Size() > 64 || c.LeaseToken == "" {
			t.Fatalf("accepted %+v", c)
		}
		for name, values := range c.Response.Headers {
			if !httpguts.ValidHeaderFieldName(name) {
				t.Fatalf("accepted header name %q", name)
			}
			if strings.EqualFold(name, engine.BlobHeader) {
				t.Fatalf("accepted the reserved header %s", name)
			}
			for _, v := range values {
				if !httpguts.ValidHeaderFieldValue(v) {
					t.Fatalf("accepted header value %q", v)
				}
			}
		}
		if c.Retention < 0 || c.Retention > engine.MaxRetention {
			t.Fatalf("accepted retention %s", c.Retention)
		}
		// A response the store keeps as sealed came as an envelope, and only then.
		if sealed := c.Response.Sealed(); (sealed != nil) != (r.Response.Sealed != nil) || sealed != nil && validEnvelope(sealed) != nil {
			t.Fatalf("accepted %+v from %s", c.Response, body)
		}
	})
}

// noNull fails on an accepted body that holds a null anywhere: the contract allows none.
func noNull(t *testing.T, body []byte) {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("accepted %q, which is not JSON: %v", body, err)
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case nil:
			return true
		case map[string]any:
			for _, m := range v {
				if walk(m) {
					return true
				}
			}
		case []any:
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	if walk(v) {
		t.Fatalf("accepted %q, which holds a null", body)
	}
}

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var p *problem
	if !errors.As(err, &p) {
		t.Fatalf("refusal %v is not a problem", err)
	}
	if p.status < 400 || p.status >= 500 || p.detail == "" || p.code == "" {
		t.Fatalf("refusal %+v is not a 4xx problem with a code and detail", p)
	}
	if p.status != http.StatusRequestEntityTooLarge && p.status != http.StatusBadRequest {
		t.Fatalf("refusal status %d", p.status)
	}
	if _, err := json.Marshal(p.detail); err != nil {
		t.Fatalf("detail cannot be rendered: %v", err)
	}
}

// FuzzDecodeBatch drives the strict decoder and the batch's validation: a batch is
// refused whole with a 4xx problem, or each of its items is either runnable or refused
// with a 4xx problem that names it.
func FuzzDecodeBatch(f *testing.F) {
	for _, seed := range []string{
		`{"items":[{"claim":{"key":"a"}}]}`,
		`{"items":[{"claim":{"key":"a","wait_ms":5}},{"complete":{"key":"a","lease_token":"t","response":{"status":200}}}]}`,
		`{"items":[{"release":{"key":"a","lease_token":"t","mode":"fail","response":{"status":500,"body":"QQ=="}}},{"extend":{"key":"a","lease_token":"t","lease_ms":100}}]}`,
		`{"items":[]}`, `{"items":[{}]}`, `{"items":[{"claim":{"key":"a"},"extend":{"key":"a"}}]}`, `{"items":null}`,
		`{"items":[null]}`, `{"items":[{"claim":null}]}`, `{"items":[{"lookup":{"key":"a"}}]}`, `{"Items":[]}`,
		`{"items":[{"claim":{"key":"\ud800"}}]}`, `{"items":[{"claim":{"key":""}}]}`,
		`{"items":[{"claim":{"key":"a"},"extend":null}]}`, `{"items":[{"claim":{"key":"a","wait_ms":null}}]}`,
	} {
		f.Add([]byte(seed))
	}
	s := &Server{limits: Limits{MaxResponseBytes: 64}}
	f.Fuzz(func(t *testing.T, body []byte) {
		var r api.BatchRequest
		if err := decodeBody(body, &r); err != nil {
			checkRefusal(t, err)
			return
		}
		noNull(t, body)
		for i, it := range r.Items {
			item, err := s.batchItem(engine.DefaultTenant, i, it)
			if err != nil {
				checkRefusal(t, err)
				return
			}
			if (item.run == nil) == (item.refused == nil) {
				t.Fatalf("item %d of %q: runnable and refused, or neither", i, body)
			}
			if item.refused != nil {
				checkRefusal(t, item.refused)
				var p *problem
				if errors.As(item.refused, &p); !strings.HasPrefix(p.detail, fmt.Sprintf("items[%d].", i)) {
					t.Fatalf("item %d refused without naming it: %q", i, p.detail)
				}
			}
		}
	})
}

// BenchmarkDecodeBatch decodes a batch of 50 claims and 50 completions as the daemon
// does, strict walk included: go test -run XXX -bench DecodeBatch ./internal/server/
func BenchmarkDecodeBatch(b *testing.B) {
	var items []string
	for i := range 50 {
		items = append(items, fmt.Sprintf(`{"claim":{"key":"idempotency-key:v1:%064x","fingerprint":"%064x","owner":"go-0123456789abcdef","claim_secret":"%032x","lease_ms":30000}}`, i, i, i))
		items = append(items, fmt.Sprintf(`{"complete":{"key":"idempotency-key:v1:%064x","lease_token":"%032x","response":{"status":201,"headers":{"Content-Type":["application/json"],"Location":["/orders/%d"]},"body":"eyJpZCI6MTIzLCJzdGF0dXMiOiJjcmVhdGVkIn0="}}}`, i, i, i))
	}
	body := []byte(`{"items":[` + strings.Join(items, ",") + `]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var r api.BatchRequest
		if err := decodeBody(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// With a blob store, a response over MaxResponseBytes is taken up to MaxBlobBytes as
// long as its headers alone stay within MaxResponseBytes; the blob header is reserved.
func TestBlobLimits(t *testing.T) {
	l := Limits{MaxResponseBytes: 100, MaxBlobBytes: 1000}
	for _, c := range []struct {
		resp engine.Response
		ok   bool
	}{
		{engine.Response{Status: 200, Body: make([]byte, 100)}, true},
		{engine.Response{Status: 200, Body: make([]byte, 1000)}, true},
		{engine.Response{Status: 200, Body: make([]byte, 1001)}, false},
		{engine.Response{Status: 200, Headers: map[string][]string{"A": {strings.Repeat("x", 100)}}, Body: make([]byte, 500)}, false},
	} {
		err := l.check("response", &c.resp, "body and headers")
		if (err == nil) != c.ok {
			t.Errorf("%d bytes with headers %d: %v, want taken %v", len(c.resp.Body), c.resp.Size()-len(c.resp.Body), err, c.ok)
		}
		if p := (*problem)(nil); err != nil && (!errors.As(err, &p) || p.status != http.StatusRequestEntityTooLarge) {
			t.Errorf("refused with %v, want 413", err)
		}
	}
	if err := (Limits{MaxResponseBytes: 100}).check("response", &engine.Response{Status: 200, Body: make([]byte, 101)}, "body"); err == nil {
		t.Error("without a blob store 101 bytes over a limit of 100 were taken")
	}
}

// A result the blob store does not hold intact is 502 result_unavailable, not a
// store outage and never a replay.
func TestResultUnavailableIsItsOwnProblem(t *testing.T) {
	p := toProblem(&engine.ResultError{Ref: engine.BlobRef{Name: "n"}})
	if p.status != http.StatusBadGateway || p.code != codeResultUnavailable {
		t.Fatalf("%d %s, want 502 result_unavailable", p.status, p.code)
	}
}
