package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/server"
)

// The raw form of a result: PUT stores what /v1/complete stores, GET answers it byte
// for byte, and bad input is refused naming the header at fault, changing nothing.
func TestRawResult(t *testing.T) { forEachStore(t, testRawResult) }

func testRawResult(t *testing.T, d *daemon) {
	put := func(key string, headers map[string]string, body []byte) answer {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, d.url+"/v1/keys/"+url.PathEscape(key)+"/result", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		a := answer{status: resp.StatusCode, header: resp.Header, raw: raw}
		_ = json.Unmarshal(raw, &a.body)
		return a
	}
	key := freshKey("raw/key")
	token := d.acquire(key)
	body := []byte{0, 1, 2, 0xff, 'x'}
	base := map[string]string{"Idemd-Lease-Token": token, "Idemd-Status": "202"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	for _, c := range []struct {
		name    string
		headers map[string]string
		status  int
		code    string
	}{
		{"bad headers JSON", with(map[string]string{"Idemd-Result-Headers": "[1]"}), 400, "invalid_request"},
		{"reserved header", with(map[string]string{"Idemd-Result-Headers": `{"Idemd-Blob":["x 1 ab"]}`}), 400, "invalid_request"},
		{"sealed with headers", with(map[string]string{"Idemd-Sealed": "1", "Idemd-Result-Headers": `{"A":["b"]}`}), 400, "invalid_request"},
		{"status out of range", with(map[string]string{"Idemd-Status": "99"}), 400, "invalid_request"},
		{"another attempt", with(map[string]string{"Idemd-Attempt": "2"}), 409, "lease_lost"},
		{"over the limit", base, 413, "payload_too_large"},
	} {
		b := body
		if c.code == "payload_too_large" {
			b = make([]byte, 2048)
		}
		wantProblem(t, put(key, c.headers, b), c.status, c.code)
	}
	if a := d.lookup(key); a.str("state") != "pending" {
		t.Fatalf("after refusals the key is %s, want pending", a.raw)
	}
	if a := put(key, with(map[string]string{"Idemd-Result-Headers": `{"X-A":["1","2"]}`, "Idemd-Attempt": "1"}), body); a.status != http.StatusOK || a.str("state") != "completed" {
		t.Fatalf("PUT: %d %s", a.status, a.raw)
	}
	resp, err := http.Get(d.url + "/v1/keys/" + url.PathEscape(key) + "/result")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, body) || resp.Header.Get("Idemd-Status") != "202" ||
		resp.Header.Get("Idemd-Result-Headers") != `{"X-A":["1","2"]}` || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("GET: %d %q %v", resp.StatusCode, got, resp.Header)
	}
	if a := d.claim(map[string]any{"key": key}); a.status != http.StatusOK {
		t.Fatalf("the JSON replay: %d %s", a.status, a.raw)
	}
	pending := freshKey("raw-pending")
	d.acquire(pending)
	for _, k := range []string{pending, freshKey("raw-absent")} {
		r, err := http.Get(d.url + "/v1/keys/" + url.PathEscape(k) + "/result")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusNotFound {
			t.Fatalf("GET the result of a key without one: %d, want 404", r.StatusCode)
		}
	}
}

// With a blob store a completion may carry a result up to MaxBlobBytes, and only the
// bodies that carry a stored response get that room: a claim as large is refused.
func TestLargeBodiesOnlyWhereResultsGo(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	blobs, err := blobdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(store, time.Hour, engine.WithBlobs(blobs, engine.BlobOptions{Threshold: 1024}))
	hs := httptest.NewServer(server.New(svc, server.Config{Limits: server.Limits{MaxResponseBytes: 1024, MaxBlobBytes: 1 << 20}}))
	t.Cleanup(hs.Close)
	d := &daemon{t: t, url: hs.URL}
	big := bytes.Repeat([]byte("y"), 200<<10)
	wantProblem(t, d.claim(map[string]any{"key": "k", "owner": string(big)}), http.StatusRequestEntityTooLarge, "payload_too_large")
	token := d.acquire("k")
	if a := d.complete("k", token, 200, big); a.status != http.StatusOK {
		t.Fatalf("a 200 KiB completion with a blob store: %d %s", a.status, a.raw)
	}
	if a := d.claim(map[string]any{"key": "k"}); a.status != http.StatusOK || a.str("outcome") != "completed" {
		t.Fatalf("replay: %d %s", a.status, a.raw)
	}
}
