package server

import (
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/idemd/idemd/internal/api"
)

// strictOnly is decodeBody without quickDecode: the reflecting path alone.
func strictOnly(body []byte, v any) error {
	if !utf8.Valid(body) {
		return &problem{status: 400, code: codeInvalidJson, detail: "request body is not valid UTF-8"}
	}
	return decodeStrict(body, v)
}

// quickBodies are bodies as the clients and the load generator send them, and a few
// more spellings of the same: quickDecode must take them all, or it saves nothing.
var quickBodies = []struct {
	name string
	v    func() any
	body string
}{
	{"claim", func() any { return new(api.ClaimRequest) }, `{"key":"orders/42","fingerprint":"load","lease_ms":30000}`},
	{"claim every member", func() any { return new(api.ClaimRequest) },
		`{"key":"k","fingerprint":"f","owner":"o","claim_secret":"0123456789abcdef0123456789abcdef","lease_ms":100,"wait_ms":0}`},
	{"claim with escapes", func() any { return new(api.ClaimRequest) }, `{"key":"a\"b\\c\/d\u00e9\ud83d\ude00\n\u0026"}`},
	{"claim spaced", func() any { return new(api.ClaimRequest) }, " {\n\t\"key\" : \"k\" ,\r\n \"lease_ms\" : -0 } \n"},
	{"claim unicode", func() any { return new(api.ClaimRequest) }, `{"key":"clé/鍵"}`},
	{"complete", func() any { return new(api.CompleteRequest) },
		`{"key":"orders/42","lease_token":"abc","response":{"status":201,"headers":{"Content-Type":["application/json"]},"body":"eyJvcmRlciI6NDJ9"}}`},
	{"complete empty", func() any { return new(api.CompleteRequest) },
		`{"key":"k","lease_token":"t","response":{"status":204,"headers":{},"body":""},"retention_ms":1000}`},
	{"complete headers", func() any { return new(api.CompleteRequest) },
		`{"key":"k","lease_token":"t","response":{"status":200,"headers":{"A":[],"B":["1","2"]}}}`},
	{"complete sealed", func() any { return new(api.CompleteRequest) },
		`{"key":"k","lease_token":"t","response":{"status":200,"sealed":"wQECazFaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlo="}}`},
	{"release retry", func() any { return new(api.ReleaseRequest) }, `{"key":"k","lease_token":"t","mode":"retry"}`},
	{"release fail", func() any { return new(api.ReleaseRequest) },
		`{"key":"k","lease_token":"t","mode":"fail","response":{"status":500,"body":"QQ=="},"retention_ms":60000}`},
	{"extend", func() any { return new(api.ExtendRequest) }, `{"key":"k","lease_token":"t","lease_ms":30000}`},
	{"batch", func() any { return new(api.BatchRequest) },
		`{"items":[{"claim":{"key":"a","fingerprint":"f","lease_ms":30000}},{"complete":{"key":"b","lease_token":"t","response":{"status":201,"headers":{"Content-Type":["application/json"]},"body":"eyJvcmRlciI6NDJ9"}}},` +
			`{"release":{"key":"c","lease_token":"t","mode":"retry"}},{"extend":{"key":"d","lease_token":"t","lease_ms":100}},{}]}`},
	{"batch empty", func() any { return new(api.BatchRequest) }, `{"items":[]}`},
}

func TestQuickDecodeTakesTheUsualBodies(t *testing.T) {
	for _, tc := range quickBodies {
		t.Run(tc.name, func(t *testing.T) {
			quick, strict := tc.v(), tc.v()
			if !quickDecode([]byte(tc.body), quick) {
				t.Fatalf("quickDecode left %s to the strict path", tc.body)
			}
			if err := strictOnly([]byte(tc.body), strict); err != nil {
				t.Fatalf("the strict path refuses %s: %v", tc.body, err)
			}
			if !reflect.DeepEqual(quick, strict) {
				t.Fatalf("%s: quickDecode gives %+v, the strict path %+v", tc.body, quick, strict)
			}
		})
	}
}

// TestQuickDecodeKnowsEveryMember sends each type quickDecode knows a body with every
// member its generated type has, so that a member added to the contract fails here
// until quick.go decodes it too (the strict path would take it, and every body with
// it would pay for reflection).
func TestQuickDecodeKnowsEveryMember(t *testing.T) {
	for _, v := range []any{new(api.ClaimRequest), new(api.CompleteRequest), new(api.ReleaseRequest), new(api.ExtendRequest),
		new(api.BatchRequest)} {
		body := everyMember(t, reflect.TypeOf(v).Elem())
		quick, strict := reflect.New(reflect.TypeOf(v).Elem()).Interface(), reflect.New(reflect.TypeOf(v).Elem()).Interface()
		if err := strictOnly([]byte(body), strict); err != nil {
			t.Fatalf("%T: the strict path refuses %s: %v", v, body, err)
		}
		if !quickDecode([]byte(body), quick) {
			t.Fatalf("%T: quickDecode leaves %s to the strict path: decode its new member in quick.go", v, body)
		}
		if !reflect.DeepEqual(quick, strict) {
			t.Fatalf("%T of %s: quickDecode gives %+v, the strict path %+v", v, body, quick, strict)
		}
	}
}

// everyMember is a JSON value of type t with every member of every object set.
func everyMember(t *testing.T, typ reflect.Type) string {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch typ.Kind() {
	case reflect.String:
		return `"fail"`
	case reflect.Int, reflect.Int64:
		return "200"
	case reflect.Map:
		return `{"A":[` + everyMember(t, typ.Elem().Elem()) + `]}`
	case reflect.Slice:
		if typ.Elem().Kind() == reflect.Uint8 {
			return `"wQECazFaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlo="`
		}
		return "[" + everyMember(t, typ.Elem()) + "]"
	case reflect.Struct:
		body := "{"
		for i, f := range fieldsOf(typ).list {
			if i > 0 {
				body += ","
			}
			body += `"` + f.name + `":` + everyMember(t, f.typ)
		}
		return body + "}"
	}
	t.Fatalf("no JSON for %s", typ)
	return ""
}

// FuzzQuickDecode holds decodeBody, which tries quickDecode first, to the reflecting
// strict path alone: on every body, for every request type quickDecode knows, the same
// refusal (status, code and the detail that names the field) or the same value.
// Run it for a while by hand: go test -run XXX -fuzz FuzzQuickDecode -fuzztime 5m ./internal/server/
func FuzzQuickDecode(f *testing.F) {
	for _, tc := range quickBodies {
		f.Add([]byte(tc.body))
	}
	for _, seed := range []string{
		`{"key":"a","key":"b"}`, `{"KEY":"a"}`, `{"key":null}`, `{"key":"a","lease_ms":1e3}`, `{"key":"a","lease_ms":01}`,
		`{"key":"a","lease_ms":99999999999999999999}`, `{"key":"a","lease_ms":-9223372036854775808}`,
		`{"key":"\ud800"}`, `{"key":"\ud800\u0041"}`, `{"key":"\udc00"}`, `{"key":"a\x01"}`, `{"k\u0065y":"a"}`,
		`{"key":"a"} {}`, `{"key":"a",}`, `{}`, `[]`, `null`, ``, `{"key":"a"`, `{"key":"\'"}`,
		`{"key":"k","lease_token":"t","response":{"status":200,"headers":{"A":["1"],"A":["2"]}}}`,
		`{"key":"k","lease_token":"t","response":{"status":200,"headers":{"A":[null]}}}`,
		`{"key":"k","lease_token":"t","response":{"status":200,"body":"QQ"}}`,
		`{"key":"k","lease_token":"t","response":{"status":200,"body":"Q\nQ=="}}`,
		`{"key":"k","lease_token":"t","response":{"status":200,"body":"Q\\nQ=="}}`,
		`{"key":"k","lease_token":"t","response":{"status":9223372036854775807}}`,
		`{"key":"k","lease_token":"t","mode":"fail","response":null}`,
		`{"key":"k","lease_token":"t","lease_ms":1.5}`,
		`{"items":[{"claim":{"key":"a"},"claim":{"key":"b"}}]}`, `{"items":[{"claim":{"key":"a"},"extend":{"key":"a"}}]}`,
		`{"items":null}`, `{"items":[null]}`, `{"items":[{"claim":null}]}`, `{"items":[{"lookup":{"key":"a"}}]}`, `{"Items":[]}`,
		`{"items":[],"items":[]}`, `{"items":[{"claim":{"key":"a"}},]}`, `{}`,
		`{"key":nullx}`, `{"lease_ms":null`, `{"key":nul,"key":"k1"}`, `{"key":"a","owner":null x}`, "null\n", `nullx`,
	} {
		f.Add([]byte(seed))
	}
	types := []func() any{
		func() any { return new(api.ClaimRequest) },
		func() any { return new(api.CompleteRequest) },
		func() any { return new(api.ReleaseRequest) },
		func() any { return new(api.ExtendRequest) },
		func() any { return new(api.BatchRequest) },
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, newValue := range types {
			got, want := newValue(), newValue()
			gotErr, wantErr := decodeBody(body, got), strictOnly(body, want)
			var gotP, wantP *problem
			errors.As(gotErr, &gotP)
			errors.As(wantErr, &wantP)
			switch {
			case (gotErr == nil) != (wantErr == nil):
				t.Fatalf("%T of %q: decodeBody says %v, the strict path %v", got, body, gotErr, wantErr)
			case gotErr != nil && (gotP == nil || wantP == nil || *gotP != *wantP):
				t.Fatalf("%T of %q: decodeBody refuses with %v, the strict path with %v", got, body, gotErr, wantErr)
			case gotErr == nil && !reflect.DeepEqual(got, want):
				t.Fatalf("%T of %q: decodeBody gives %+v, the strict path %+v", got, body, got, want)
			}
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	for _, tc := range quickBodies {
		if tc.name != "claim" && tc.name != "complete" {
			continue
		}
		body := []byte(tc.body)
		b.Run(tc.name+"/strict", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := strictOnly(body, tc.v()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/quick", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := decodeBody(body, tc.v()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
