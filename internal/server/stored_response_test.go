package server_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/engine/boltstore"
)

// TestStoredResponsesAreValidated: a stored response is replayed to later callers, so
// idemd refuses what an HTTP server could not send: headers that would split or frame
// the replay, hop-by-hop headers, interim statuses and bodies on bodiless statuses.
// Each refusal names the field and stores nothing.
func TestStoredResponsesAreValidated(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	d := newDaemon(t, store)
	for _, tc := range []struct {
		name    string
		status  int
		headers map[string][]string
		body    []byte
		detail  string
	}{
		{"a header value with CR LF", 200, map[string][]string{"X-A": {"ok\r\nSet-Cookie: evil=1"}}, nil, `response.headers["X-A"]`},
		{"a header value with a bare LF", 200, map[string][]string{"X-A": {"a\nb"}}, nil, `response.headers["X-A"]`},
		{"a header value with NUL", 200, map[string][]string{"X-A": {"a\x00b"}}, nil, `response.headers["X-A"]`},
		{"a header name with a space", 200, map[string][]string{"Bad Name": {"x"}}, nil, `response.headers["Bad Name"]`},
		{"a header name with a colon", 200, map[string][]string{"Bad:": {"x"}}, nil, `response.headers["Bad:"]`},
		{"Transfer-Encoding", 200, map[string][]string{"Transfer-Encoding": {"chunked"}}, nil, `response.headers["Transfer-Encoding"]`},
		{"Content-Length in any case", 200, map[string][]string{"content-length": {"5"}}, nil, `response.headers["content-length"]`},
		{"Connection", 200, map[string][]string{"Connection": {"close"}}, nil, `response.headers["Connection"]`},
		{"Keep-Alive", 200, map[string][]string{"Keep-Alive": {"timeout=5"}}, nil, `response.headers["Keep-Alive"]`},
		{"Upgrade", 200, map[string][]string{"Upgrade": {"websocket"}}, nil, `response.headers["Upgrade"]`},
		{"TE", 200, map[string][]string{"TE": {"trailers"}}, nil, `response.headers["TE"]`},
		{"Trailer", 200, map[string][]string{"Trailer": {"X-Sum"}}, nil, `response.headers["Trailer"]`},
		{"Proxy-Authenticate", 200, map[string][]string{"Proxy-Authenticate": {"Basic"}}, nil, `response.headers["Proxy-Authenticate"]`},
		{"Proxy-Connection", 200, map[string][]string{"Proxy-Connection": {"keep-alive"}}, nil, `response.headers["Proxy-Connection"]`},
		{"status 100", 100, nil, nil, "response.status"},
		{"status 101 (a replay would hang its client)", 101, nil, nil, "response.status"},
		{"status 103", 103, nil, nil, "response.status"},
		{"204 with a body", 204, nil, []byte("x"), "response.body"},
		{"304 with a body", 304, nil, []byte("x"), "response.body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := map[string]any{"status": tc.status}
			if tc.body != nil {
				resp["body"] = tc.body
			}
			if tc.headers != nil {
				resp["headers"] = tc.headers
			}
			for _, path := range []string{"/v1/complete", "/v1/release"} {
				key := freshKey("stored")
				token := d.acquire(key)
				req := map[string]any{"key": key, "lease_token": token, "response": resp}
				if path == "/v1/release" {
					req["mode"] = "fail"
				}
				a := d.post(path, req)
				wantProblem(t, a, http.StatusBadRequest, "invalid_request")
				if !strings.Contains(a.str("detail"), tc.detail) {
					t.Errorf("%s: detail %q does not name %s", path, a.str("detail"), tc.detail)
				}
				if l := d.lookup(key); l.str("state") != "pending" {
					t.Errorf("%s: refused response changed the record: %s", path, l.raw)
				}
			}
		})
	}
	// What HTTP allows still works: 204 and 304 without a body, a header value with a
	// tab and non-ASCII bytes, and an ordinary header such as Content-Type.
	for _, status := range []int{204, 304} {
		key := freshKey("ok")
		token := d.acquire(key)
		a := d.post("/v1/complete", map[string]any{"key": key, "lease_token": token, "response": map[string]any{
			"status": status, "headers": map[string][]string{"X-A": {"a\tb é"}, "Content-Type": {"text/plain"}}}})
		if a.status != 200 {
			t.Fatalf("complete with %d: %d %s", status, a.status, a.raw)
		}
	}
}
