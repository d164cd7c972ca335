package idem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/clients/go/idemapi"
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

// FuzzBatchResults holds the one-pass reader of batch answers to encoding/json: an
// answer it reads, encoding/json reads too, into the same results; anything else it
// leaves to encoding/json, so that decodeBatchResults fails exactly when
// encoding/json does.
func FuzzBatchResults(f *testing.F) {
	for _, seed := range []string{
		`{"results":[{"status":201,"acquired":{"outcome":"acquired","lease_token":"6f1c0e8a9b2d4c7e","attempt":1,"lease_expires_at":"2026-11-23T17:20:01.123Z","expires_at":"2026-11-24T17:19:31.123Z","recovered":false}}]}` + "\n",
		`{"results":[{"status":200,"record":{"key":"idempotency-key:v1:ab","state":"completed","attempt":2,"fingerprint":"sha256:00ff","owner":"go-1","created_at":"2026-11-23T17:19:31.1Z","updated_at":"2026-11-23T17:19:31.2Z","expires_at":"2026-11-24T17:19:31.2Z","response":{"status":201,"headers":{"content-type":["application/json"],"location":["/orders/7"]},"body":"eyJpZCI6N30="}}},` +
			`{"status":200,"finished":{"outcome":"completed","attempt":1,"expires_at":"2026-11-24T17:19:31Z","response":{"status":201,"headers":{"location":["/a","/b"],"x-empty":[]},"body":""}}},` +
			`{"status":200,"extended":{"lease_expires_at":"2026-11-23T17:20:01Z","expires_at":"2026-11-24T17:20:01Z"}},` +
			`{"status":409,"problem":{"type":"about:blank","title":"Conflict","status":409,"code":"in_progress","retry_after_ms":1000}}]}`,
		` { "results" : [ { "status" : 200 , "record" : { "state" : "failed" , "attempt" : 3 , "expires_at" : "2026-11-24T17:19:31Z" , "extra" : [ 1 , true , { "x" : false } ] } } ] } `,
		`{"results":[{"status":201,"acquired":{"outcome":"acquired","lease_token":"9a","attempt":2,"lease_expires_at":"2026-11-23T17:20:01Z","expires_at":"2026-11-24T17:19:31Z","recovered":true,"recovery_point":{"name":"charged","data":"Y2hfMQ==","attempt":1,"recorded_at":"2026-11-23T17:19:30.5Z"}}},` +
			`{"status":200,"record":{"state":"released","attempt":1,"expires_at":"2026-11-24T17:19:31Z","recovery_point":{"name":"charged","attempt":1,"recorded_at":"2026-11-23T17:19:30Z"}}}]}`,
		`{"results":[{"status":201,"acquired":{"recovery_point":{"name":"a","data":""}}}]}`, `{"results":[{"status":201,"acquired":{"recovery_point":null}}]}`,
		`{"results":[{"status":201,"acquired":{"recovery_point":{"Name":"a"}}}]}`,
		`{"results":[]}`, `{"results":null}`, `{"Results":[{"status":200}]}`, `{"results":[{"status":200,"STATUS":201}]}`,
		`{"results":[{"status":200,"status":201}]}`, `{"results":[{"status":2.5e2}]}`, `{"results":[{"status":-0}]}`, `{"results":[{"status":01}]}`,
		`{"results":[{"status":200,"record":{"fingerprint":"a\"b","state":"x"}}]}`, `{"results":[{"status":200,"record":{"expires_at":"yesterday"}}]}`,
		`{"results":[{"status":200,"finished":{"outcome":"completed","attempt":1,"expires_at":"2026-11-24T17:19:31Z","response":{"status":201,"sealed":"wQEJay0yMDI2LTEx287J6GPzMDK534obpItrU7BlMakHuMRXt/0XaxZj0j7+zGgzl6eNaG8NdK8EXfZwVIUBSQ=="}}}]}`,
		`{"results":[{"status":200,"finished":{"response":{"sealed":"","sealed":"AA=="}}}]}`, `{"results":[{"status":200,"finished":{"response":{"Sealed":"AA=="}}}]}`,
		`{"results":[{"status":200,"finished":{"response":{"body":"not base64!"}}}]}`,
		`{"results":[{"status":200,"finished":{"response":{"headers":{"a":["1"],"a":["2"]}}}}]}`,
		`{"results":[{"status":99999999999999999999}]}`, `{"results":[{"status":200}]} trailing`, `{"results":[{"status":200},]}`, `{"results":[{"status":200}]`, "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var want batchResults
		wantErr := json.Unmarshal([]byte(body), &want)
		var fast batchResults
		if fastBatchResults([]byte(body), &fast) {
			if wantErr != nil {
				t.Fatalf("read %q, which encoding/json refuses: %v", body, wantErr)
			}
			if !reflect.DeepEqual(fast, want) {
				t.Fatalf("read %q as\n%+v\nencoding/json as\n%+v", body, fast, want)
			}
		}
		var got batchResults
		if err := decodeBatchResults([]byte(body), &got); (err != nil) != (wantErr != nil) {
			t.Fatalf("decodeBatchResults(%q): %v; encoding/json: %v", body, err, wantErr)
		}
	})
}

// FuzzEncode holds the encoding of requests to json.Marshal, byte for byte.
func FuzzEncode(f *testing.F) {
	f.Add("idempotency-key:v1:00ff", "sha256:ab", "go-1", "6f1c0e8a", "location", "/orders/1", []byte(`{"id":1}`), int64(30000), 201, uint8(0))
	f.Add("k\x00<é>\u2028\xff\"\\", "", "", "", "", "", []byte{}, int64(-1), 0, uint8(255))
	f.Fuzz(func(t *testing.T, key, fingerprint, owner, token, header, value string, body []byte, ms int64, status int, absent uint8) {
		set := func(bit uint8, s string) *string {
			if absent&bit != 0 {
				return nil
			}
			return &s
		}
		msPtr := func(bit uint8) *int64 {
			if absent&bit != 0 {
				return nil
			}
			return &ms
		}
		resp := idemapi.StoredResponse{Status: status}
		if absent&64 == 0 {
			resp.Body = &body
		}
		if absent&128 == 0 {
			h := map[string][]string{header: {value, owner}, "content-type": {value}, "x-none": nil}
			resp.Headers = &h
		}
		if absent&(64|128) == 64|128 {
			// A sealed response carries neither.
			resp.Sealed = &body
		}
		items := []idemapi.BatchItem{
			{Claim: &idemapi.ClaimRequest{ClaimSecret: set(1, token), Fingerprint: set(2, fingerprint), Key: key, LeaseMs: msPtr(4), Owner: set(8, owner), WaitMs: msPtr(16)}},
			{Complete: &idemapi.CompleteRequest{Key: key, LeaseToken: token, Response: resp, RetentionMs: msPtr(32)}},
			{Release: &idemapi.ReleaseRequest{Key: key, LeaseToken: token, Mode: idemapi.ReleaseRequestMode(owner), RetentionMs: msPtr(1)}},
			{Release: &idemapi.ReleaseRequest{Key: key, LeaseToken: token, Mode: "fail", Response: &resp}},
			{Extend: &idemapi.ExtendRequest{Key: key, LeaseMs: ms, LeaseToken: token}},
		}
		for _, item := range items {
			op, got, err := encode(item)
			if err != nil {
				t.Fatal(err)
			}
			var member any = map[string]any{"claim": item.Claim, "complete": item.Complete, "release": item.Release, "extend": item.Extend}[op]
			want, err := json.Marshal(member)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s encoded as\n%s\njson.Marshal writes\n%s", op, got, want)
			}
		}
	})
}

// TestEncodeKnowsEveryField fills every field of every request, by reflection, and
// holds encode to json.Marshal: a member the contract gains and encode does not write
// fails here, whatever the fuzz corpus holds.
func TestEncodeKnowsEveryField(t *testing.T) {
	for _, item := range []idemapi.BatchItem{
		{Claim: filled[idemapi.ClaimRequest](t)},
		{Complete: filled[idemapi.CompleteRequest](t)},
		{Release: filled[idemapi.ReleaseRequest](t)},
		{Extend: filled[idemapi.ExtendRequest](t)},
	} {
		op, got, err := encode(item)
		if err != nil {
			t.Fatal(err)
		}
		member := map[string]any{"claim": item.Claim, "complete": item.Complete, "release": item.Release, "extend": item.Extend}[op]
		want, err := json.Marshal(member)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s encoded as\n%s\njson.Marshal writes\n%s", op, got, want)
		}
	}
}

// TestAnswerReaderKnowsEveryField fills every member of each answer a batch item
// carries but a problem, by reflection, and holds the one-pass reader to
// encoding/json: a member the contract gains and the reader skips fails here.
func TestAnswerReaderKnowsEveryField(t *testing.T) {
	for _, item := range []batchItemResult{
		{Status: 201, Acquired: filled[idemapi.ClaimAcquired](t)},
		{Status: 200, Finished: filled[idemapi.ClaimFinished](t)},
		{Status: 200, Record: filled[finishedRecord](t)},
		{Status: 200, Extended: filled[idemapi.LeaseExtended](t)},
	} {
		body, err := json.Marshal(batchResults{Results: []batchItemResult{item}})
		if err != nil {
			t.Fatal(err)
		}
		var fast, want batchResults
		if !fastBatchResults(body, &fast) {
			t.Fatalf("the one-pass reader leaves %s to encoding/json", body)
		}
		if err := json.Unmarshal(body, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Errorf("read %s as\n%+v\nencoding/json as\n%+v", body, fast.Results[0], want.Results[0])
		}
	}
}

// filled returns a T with every field set to a value that is not its zero.
func filled[T any](t *testing.T) *T {
	v := new(T)
	fill(t, reflect.ValueOf(v).Elem())
	return v
}

func fill(t *testing.T, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem())
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 23, 17, 19, 31, 123e6, time.UTC)))
			return
		}
		for i := range v.NumField() {
			fill(t, v.Field(i))
		}
	case reflect.String:
		v.SetString("s")
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0))
	case reflect.Uint8:
		v.SetUint('b')
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k)
		fill(t, e)
		m.SetMapIndex(k, e)
		v.Set(m)
	default:
		t.Fatalf("no value to fill a %s with", v.Type())
	}
}
