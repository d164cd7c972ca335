package idem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// FuzzCanonicalBody checks the JSON canonicalisation the middleware fingerprints
// with (RFC 8785 through the JCS library): it never panics, it is idempotent, and a
// body it canonicalised means the same JSON as before.
func FuzzCanonicalBody(f *testing.F) {
	for _, seed := range []string{`{"b":1,"a":[1,2,{"d":null,"c":"x"}]}`, "{ \"a\" : 1.50e3 }", `[]`, `"s"`, `{"a":1}{"b":2}`, "not json", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		once, _ := canonicalBody("application/json", "", []byte(body))
		if twice, _ := canonicalBody("application/json", "", once); !bytes.Equal(once, twice) {
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
		// Compared as values: JCS writes numbers as doubles, so -0 becomes 0, which
		// compares equal to it.
		if !reflect.DeepEqual(before, after) {
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

// FuzzKeyHeader reads arbitrary Idempotency-Key lines: it never panics, a key it
// accepts is 1 to 255 bytes of printable ASCII, and a key written as an sf-string
// reads back as itself.
func FuzzKeyHeader(f *testing.F) {
	for _, seed := range []string{`"abc"`, "abc", `"a\"b\\c"`, `"k";p=1`, `"unterminated`, "a b", ":YWJj:", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		key, err := parseKeyHeader([]string{line})
		if err != nil {
			return
		}
		if len(key) == 0 || len(key) > maxHeaderKeyBytes {
			t.Fatalf("%q gave a key of %d bytes", line, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("%q gave a key with byte 0x%02x", line, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := parseKeyHeader([]string{quoted}); err != nil || again != key {
			t.Fatalf("%q gave %q, whose sf-string %s gave %q, %v", line, key, quoted, again, err)
		}
	})
}
