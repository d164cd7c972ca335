package idem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

// FuzzCanonicalBody checks the JSON canonicalisation the middleware fingerprints
// with: it never panics, it is idempotent, and a body it canonicalised means the same
// JSON as before.
func FuzzCanonicalBody(f *testing.F) {
	for _, seed := range []string{`{"b":1,"a":[1,2,{"d":null,"c":"x"}]}`, "{ \"a\" : 1.50e3 }", `[]`, `"s"`, `{"a":1}{"b":2}`, "not json", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		once := canonicalBody("application/json", []byte(body))
		if twice := canonicalBody("application/json", once); !bytes.Equal(once, twice) {
			t.Fatalf("not idempotent: %q -> %q -> %q", body, once, twice)
		}
		if bytes.Equal(once, []byte(body)) {
			return
		}
		var before, after any
		if err := json.Unmarshal([]byte(body), &before); err != nil {
			t.Fatalf("rewrote a body that is not JSON: %q -> %q", body, once)
		}
		if err := json.Unmarshal(once, &after); err != nil {
			t.Fatalf("canonical form is not JSON: %q", once)
		}
		b1, _ := json.Marshal(before)
		b2, _ := json.Marshal(after)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("canonical form means something else: %q -> %q", body, once)
		}
	})
}

// FuzzProblem decodes arbitrary error answers: it never panics and always keeps the
// HTTP status.
func FuzzProblem(f *testing.F) {
	f.Add(409, "application/problem+json", `{"type":"urn:idemd:problem:in_progress","title":"Conflict","status":409,"code":"in_progress","retry_after_ms":1500}`)
	f.Add(502, "text/html", "<html>bad gateway</html>")
	f.Add(503, "application/json", `{"code":7}`)
	f.Fuzz(func(t *testing.T, status int, contentType, body string) {
		resp := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}}}
		p := problemFrom(resp, []byte(body))
		if p.Status != status {
			t.Fatalf("status %d became %d", status, p.Status)
		}
		_ = p.Error()
	})
}
