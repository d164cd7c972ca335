package idem

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// The shared vectors in clients/testdata pin the fingerprint, the idemd key and the
// reading of the Idempotency-Key header for every language's middleware; their
// format is in clients/testdata/README.md.

func readVectors[T any](t *testing.T, file string) []T {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Vectors []T }
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(doc.Vectors) == 0 {
		t.Fatalf("%s has no vectors", file)
	}
	return doc.Vectors
}

// vectorBytes is a vector's text field, or its _base64 twin when the bytes are not
// UTF-8.
func vectorBytes(t *testing.T, text *string, b64 string) []byte {
	t.Helper()
	if text != nil {
		return []byte(*text)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFingerprintVectors(t *testing.T) {
	type vector struct {
		Name                string
		Method, Path, Query string
		ContentType         *string `json:"content_type"`
		ContentEncoding     *string `json:"content_encoding"`
		Body                *string
		BodyBase64          string  `json:"body_base64"`
		CanonicalJSON       bool    `json:"canonical_json"`
		HashedBody          *string `json:"hashed_body"`
		HashedBodyBase64    string  `json:"hashed_body_base64"`
		Fingerprint         string
	}
	for _, v := range readVectors[vector](t, "fingerprint.json") {
		t.Run(v.Name, func(t *testing.T) {
			body := vectorBytes(t, v.Body, v.BodyBase64)
			target := v.Path
			if v.Query != "" {
				target += "?" + v.Query
			}
			r, err := http.NewRequest(v.Method, "http://service.test"+target, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.RequestURI = target
			if v.ContentType != nil {
				r.Header.Set("Content-Type", *v.ContentType)
			}
			if v.ContentEncoding != nil {
				r.Header.Set("Content-Encoding", *v.ContentEncoding)
			}
			hashed, canonical := canonicalBody(mediaType(r.Header.Get("Content-Type")), r.Header.Get("Content-Encoding"), body)
			if want := vectorBytes(t, v.HashedBody, v.HashedBodyBase64); string(hashed) != string(want) || canonical != v.CanonicalJSON {
				t.Errorf("hashed body %q (canonical JSON %v), want %q (%v)", hashed, canonical, want, v.CanonicalJSON)
			}
			if got := Fingerprint(r, body); got != v.Fingerprint {
				t.Errorf("fingerprint %s, want %s", got, v.Fingerprint)
			}
		})
	}
}

func TestIdemdKeyVectors(t *testing.T) {
	type vector struct {
		Name, Scope, Key string
		IdemdKey         string `json:"idemd_key"`
	}
	for _, v := range readVectors[vector](t, "idemd_key.json") {
		if got := MiddlewareKey(v.Scope, v.Key); got != v.IdemdKey || len(got) > 255 {
			t.Errorf("%s: MiddlewareKey(%q, %q) = %s, want %s", v.Name, v.Scope, v.Key, got, v.IdemdKey)
		}
	}
}

func TestIdempotencyKeyHeaderVectors(t *testing.T) {
	type vector struct {
		Name       string
		FieldLines []string `json:"field_lines"`
		Key        *string
		Missing    bool
		Error      bool
	}
	for _, v := range readVectors[vector](t, "idempotency_key_header.json") {
		// Each character of a field line stands for one byte (ISO 8859-1), so that
		// lines with bytes above 0x7F fit in JSON.
		lines := make([]string, len(v.FieldLines))
		for i, l := range v.FieldLines {
			b := make([]byte, 0, len(l))
			for _, r := range l {
				if r > 0xff {
					t.Fatalf("%s: field line has %U, beyond one byte", v.Name, r)
				}
				b = append(b, byte(r))
			}
			lines[i] = string(b)
		}
		key, err := parseKeyHeader(lines)
		switch {
		case v.Missing:
			if err != errNoKey {
				t.Errorf("%s: %q gave %q, %v; want no key", v.Name, lines, key, err)
			}
		case v.Error:
			if err == nil || err == errNoKey {
				t.Errorf("%s: %q gave %q, %v; want an error", v.Name, lines, key, err)
			}
		case v.Key == nil:
			t.Errorf("%s: the vector has no key, error or missing", v.Name)
		case err != nil || key != *v.Key:
			t.Errorf("%s: %q gave %q, %v; want %q", v.Name, lines, key, err, *v.Key)
		}
	}
}
