package server_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/engine/boltstore"
)

// TestDecodingIsAsStrictAsTheContract: the contract says additionalProperties: false
// and names its members exactly, and a key is a string of Unicode characters. A body
// with a member twice, a member in another case, or an escape that is half a
// surrogate pair is refused with a 400 naming the member, and nothing is stored. So is
// a null, which no member of the contract allows (encoding/json would read it as absent).
func TestDecodingIsAsStrictAsTheContract(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	d := newDaemon(t, store)
	token := d.acquire("held")
	for _, tc := range []struct {
		name, path, body, field string
		untouched               []string
	}{
		{"a member twice", "/v1/claim", `{"key":"dup-1","key":"dup-2"}`, `"key"`, []string{"dup-1", "dup-2"}},
		{"a member twice, apart", "/v1/claim", `{"key":"dup-3","lease_ms":500,"key":"dup-4"}`, `"key"`, []string{"dup-3", "dup-4"}},
		{"a member in upper case", "/v1/claim", `{"KEY":"case-1"}`, `"KEY"`, []string{"case-1"}},
		{"a member in mixed case", "/v1/claim", `{"key":"case-2","Lease_Ms":500}`, `"Lease_Ms"`, []string{"case-2"}},
		{"a lone high surrogate", "/v1/claim", `{"key":"sur\ud800x"}`, `"key"`, []string{"sur\uFFFDx"}},
		{"a lone low surrogate", "/v1/claim", `{"key":"sur\udc00x"}`, `"key"`, []string{"sur\uFFFDx"}},
		{"a high surrogate at the end", "/v1/claim", `{"key":"sur\ud800"}`, `"key"`, []string{"sur\uFFFD"}},
		{"two high surrogates", "/v1/claim", `{"key":"sur\ud800\ud800"}`, `"key"`, nil},
		{"a surrogate in a member name", "/v1/claim", `{"key":"s-1","\ud800":1}`, `"\ud800"`, []string{"s-1"}},
		{"a nested member twice", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"status":200,"status":500}}`, `"response.status"`, nil},
		{"a header twice", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"status":200,"headers":{"A":["1"],"A":["2"]}}}`, `"response.headers.A"`, nil},
		{"a nested member in another case", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"Status":200}}`, `"response.Status"`, nil},
		{"a lone surrogate in a header value", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"status":200,"headers":{"A":["\udfff"]}}}`, `"response.headers.A[0]"`, nil},
		{"a null member", "/v1/claim", `{"key":"null-1","wait_ms":null}`, `"wait_ms"`, []string{"null-1"}},
		{"a null key", "/v1/claim", `{"key":null}`, `"key"`, nil},
		{"a null batch member beside a claim", "/v1/batch", `{"items":[{"claim":{"key":"null-2"},"extend":null}]}`, `"items[0].extend"`, []string{"null-2"}},
		{"a null batch item", "/v1/batch", `{"items":[{"claim":{"key":"null-3"}},null]}`, `"items[1]"`, []string{"null-3"}},
		{"a null response", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":null}`, `"response"`, nil},
		{"a null header value", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"status":200,"headers":{"A":null}}}`, `"response.headers.A"`, nil},
		{"a null in a header's values", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"status":200,"headers":{"A":["1",null]}}}`, `"response.headers.A[1]"`, nil},
		{"a null recovery point", "/v1/recovery-point", `{"key":"held","lease_token":"` + token + `","name":"charged","data":null}`, `"data"`, nil},
		{"a null body", "/v1/claim", `null`, `null`, nil},
		{"a recovery point's data not in base64", "/v1/recovery-point", `{"key":"held","lease_token":"` + token + `","name":"charged","data":"&x"}`, `data: not valid base64`, nil},
		{"a response's body not in base64", "/v1/complete", `{"key":"held","lease_token":"` + token + `","response":{"status":200,"body":"&x"}}`, `response.body: not valid base64`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := d.do(http.MethodPost, tc.path, "application/json", []byte(tc.body))
			wantProblem(t, a, http.StatusBadRequest, "invalid_request")
			if !strings.Contains(a.str("detail"), tc.field) {
				t.Errorf("detail %q does not name %s", a.str("detail"), tc.field)
			}
			for _, key := range tc.untouched {
				if l := d.lookup(key); l.status != http.StatusNotFound {
					t.Errorf("%q was stored: %s", key, l.raw)
				}
			}
		})
	}
	if l := d.lookup("held"); l.str("state") != "pending" {
		t.Fatalf("refused completions changed the held record: %s", l.raw)
	}
	// What the contract allows still works: a surrogate pair, a literal backslash
	// before a u, and U+FFFD itself.
	for key, body := range map[string]string{
		"pair-😀":      `{"key":"pair-\ud83d\ude00"}`,
		`lit-\ud800`:  `{"key":"lit-\\ud800"}`,
		"fffd-\uFFFD": `{"key":"fffd-\ufffd"}`,
	} {
		if a := d.do(http.MethodPost, "/v1/claim", "application/json", []byte(body)); a.status != 201 {
			t.Errorf("%s: %d %s", body, a.status, a.raw)
		}
		if l := d.lookup(key); l.status != 200 {
			t.Errorf("%q not found after claiming it with %s: %s", key, body, l.raw)
		}
	}
}

// TestNullIsANullOnlyWhenDelimited: a null is the four letters followed by a delimiter,
// or by the body's end where the null is the whole body. A word that merely begins with
// null is malformed JSON, and a body cut short after a null is too; neither is explained
// as a null member. A malformed word does not hide what the walk finds after it.
func TestNullIsANullOnlyWhenDelimited(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	d := newDaemon(t, store)
	for _, tc := range []struct {
		name, body, code, detail string
	}{
		{"a word that begins with null", `{"key":nullx}`, "invalid_json", ""},
		{"a word that begins with null, twice over", `{"key":"n-3","owner":nullnull}`, "invalid_json", ""},
		{"a null before something other than a delimiter", `{"key":"n-4","owner":null x}`, "invalid_json", ""},
		{"a body cut short after a null", `{"lease_ms":null`, "invalid_json", ""},
		{"a body cut short after a null and a space", `{"lease_ms":null `, "invalid_json", ""},
		{"a whole body that begins with null", `nullx`, "invalid_json", ""},
		{"a half null before a member twice", `{"key":nul,"key":"k1"}`, "invalid_request", `"key" appears twice`},
		{"a null before a space", `{"key":"n-1","wait_ms":null }`, "invalid_request", `"wait_ms" is null`},
		{"a null before a member", `{"wait_ms":null,"key":"n-2"}`, "invalid_request", `"wait_ms" is null`},
		{"a whole null body before a space", "null\n", "invalid_request", "body is null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := d.do(http.MethodPost, "/v1/claim", "application/json", []byte(tc.body))
			wantProblem(t, a, http.StatusBadRequest, tc.code)
			if !strings.Contains(a.str("detail"), tc.detail) {
				t.Errorf("detail %q does not say %s", a.str("detail"), tc.detail)
			}
		})
	}
	for _, key := range []string{"k1", "n-1", "n-2", "n-3", "n-4"} {
		if l := d.lookup(key); l.status != http.StatusNotFound {
			t.Errorf("%q was stored: %s", key, l.raw)
		}
	}
}
