package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobs3"
	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/tests3"
)

// blobAnswer is what the tests read of an blobAnswer: its status, problem code, and the
// stored response a claim replays.
type blobAnswer struct {
	Status     int
	Code       string `json:"code"`
	LeaseToken string `json:"lease_token"`
	Response   *struct {
		Status int    `json:"status"`
		Body   []byte `json:"body"`
	} `json:"response"`
}

func blobCall(t *testing.T, base, method, path string, body any) blobAnswer {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var a blobAnswer
	if resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatalf("%s %s: %d, undecodable: %v", method, path, resp.StatusCode, err)
		}
	}
	a.Status = resp.StatusCode
	return a
}

func claimKey(t *testing.T, base, key string) blobAnswer {
	t.Helper()
	return blobCall(t, base, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp"})
}

func completeKey(t *testing.T, base, key, token string, body []byte) blobAnswer {
	t.Helper()
	return blobCall(t, base, http.MethodPost, "/v1/complete", map[string]any{"key": key, "lease_token": token,
		"response": map[string]any{"status": 200, "headers": map[string][]string{"Content-Type": {"application/octet-stream"}}, "body": body}})
}

// completeLarge claims key and completes it with body, and checks that a claim then
// replays it byte for byte.
func completeLarge(t *testing.T, base, key string, body []byte) {
	t.Helper()
	a := claimKey(t, base, key)
	if a.Status != http.StatusCreated {
		t.Fatalf("claim %s: %d %s", key, a.Status, a.Code)
	}
	if c := completeKey(t, base, key, a.LeaseToken, body); c.Status != http.StatusOK {
		t.Fatalf("complete %s with %d bytes: %d %s", key, len(body), c.Status, c.Code)
	}
	replay := claimKey(t, base, key)
	if replay.Status != http.StatusOK || replay.Response == nil || !bytes.Equal(replay.Response.Body, body) {
		n := -1
		if replay.Response != nil {
			n = len(replay.Response.Body)
		}
		t.Fatalf("replay of %s: %d %s, %d bytes; want 200 and the %d bytes completed", key, replay.Status, replay.Code, n, len(body))
	}
}

func randomBody(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func blobMetric(t *testing.T, p *process, op string) string {
	t.Helper()
	return p.metric(t, fmt.Sprintf(`idemd_blob_errors_total{op=%q}`, op))
}

// The real binary on the embedded store with a blob directory: a 16 MiB result
// completes and replays byte for byte; a small one stays in the record; a blob
// altered or missing answers 502 result_unavailable, never 200, and counts in
// idemd_blob_errors_total; a purge deletes the blob.
func TestLargeResultsInADirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := buildDaemon(t)
	dir := t.TempDir()
	// The deadline is not what this tests: 16 MiB through a busy machine gets room.
	p := startWith(t, bin, "--blob-store", "file://"+dir, "--store-timeout", "10s")
	blobs := func() []string {
		files, err := filepath.Glob(filepath.Join(dir, "*", "*"))
		if err != nil {
			t.Fatal(err)
		}
		return files
	}

	body := randomBody(t, 16<<20)
	completeLarge(t, p.base, "large", body)
	if got := blobs(); len(got) != 1 {
		t.Fatalf("blobs after one large completion: %v", got)
	}
	completeLarge(t, p.base, "small", []byte("small result"))
	if got := blobs(); len(got) != 1 {
		t.Fatalf("a small result made a blob: %v", got)
	}

	// The raw form: the body as the request and answer body, status and headers in
	// headers; a key with a slash, path-escaped.
	rawKey := "raw/" + t.Name()
	if a := claimKey(t, p.base, rawKey); a.Status != http.StatusCreated {
		t.Fatalf("claim %s: %d %s", rawKey, a.Status, a.Code)
	} else if code, text := putRaw(t, p.base, rawKey, a.LeaseToken, body); code != http.StatusOK {
		t.Fatalf("PUT the raw result: %d %s", code, text)
	}
	code, h, got := getRaw(t, p.base, rawKey)
	if code != http.StatusOK || !bytes.Equal(got, body) || h.Get("Idemd-Status") != "201" ||
		h.Get("Idemd-Result-Headers") != `{"Content-Type":["application/octet-stream"],"X-Result":["raw"]}` || h.Get("Idemd-Outcome") != "completed" {
		t.Fatalf("GET the raw result: %d, %d bytes, headers %v; want 200, the %d bytes put, status 201 and their headers", code, len(got), h, len(body))
	}
	if replay := claimKey(t, p.base, rawKey); replay.Status != http.StatusOK || replay.Response == nil || replay.Response.Status != 201 || !bytes.Equal(replay.Response.Body, body) {
		t.Fatalf("the JSON replay of a raw result: %d %s", replay.Status, replay.Code)
	}
	if got := blobs(); len(got) != 2 {
		t.Fatalf("blobs after a raw large completion: %v", got)
	}
	for _, f := range blobs() {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, got := getRaw(t, p.base, rawKey); code != http.StatusBadGateway || bytes.Contains(got, body[:64]) {
		t.Fatalf("GET the raw result of a missing blob: %d, want 502 and none of its bytes", code)
	}
	completeLarge(t, p.base, "large-again", body)

	before := blobMetric(t, p, "verify")
	f, err := os.OpenFile(blobs()[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{body[1000] ^ 0xff}, 1000); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	for _, a := range []blobAnswer{claimKey(t, p.base, "large-again"), blobCall(t, p.base, http.MethodGet, "/v1/records/large-again", nil)} {
		if a.Status != http.StatusBadGateway || a.Code != "result_unavailable" || a.Response != nil {
			t.Fatalf("an altered blob answered %d %q (response %v), want 502 result_unavailable", a.Status, a.Code, a.Response != nil)
		}
	}
	if after := blobMetric(t, p, "verify"); after == before {
		t.Fatalf("idemd_blob_errors_total{op=\"verify\"} stayed %s", after)
	}
	if err := os.Remove(blobs()[0]); err != nil {
		t.Fatal(err)
	}
	if a := claimKey(t, p.base, "large-again"); a.Status != http.StatusBadGateway || a.Code != "result_unavailable" {
		t.Fatalf("a missing blob answered %d %q, want 502 result_unavailable", a.Status, a.Code)
	}

	completeLarge(t, p.base, "purged", randomBody(t, 1<<20))
	if got := blobs(); len(got) != 1 {
		t.Fatalf("blobs: %v", got)
	}
	if a := blobCall(t, p.base, http.MethodDelete, "/v1/records/purged", nil); a.Status != http.StatusNoContent {
		t.Fatalf("purge: %d %s", a.Status, a.Code)
	}
	if got := blobs(); len(got) != 0 {
		t.Fatalf("the purged record's blob is still there: %v", got)
	}
}

func putRaw(t *testing.T, base, key, token string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, base+"/v1/keys/"+url.PathEscape(key)+"/result", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Idemd-Lease-Token", token)
	req.Header.Set("Idemd-Status", "201")
	req.Header.Set("Idemd-Attempt", "1")
	req.Header.Set("Idemd-Result-Headers", `{"Content-Type":["application/octet-stream"],"X-Result":["raw"]}`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(text)
}

func getRaw(t *testing.T, base, key string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Get(base + "/v1/keys/" + url.PathEscape(key) + "/result")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the raw result: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

// The real binary on Redis with its blobs in a real S3 server: a 16 MiB result
// completes and replays byte for byte; a purge deletes the object; with the S3 server
// stopped a large completion answers 503 within the store deadline while small
// results are unaffected.
func TestLargeResultsInS3(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon, Redis and an S3 server")
	}
	s3srv := tests3.Start(t)
	r := testredis.Start(t)
	bin := buildDaemon(t)
	p := startWith(t, bin, "--store", r.URL(), "--blob-store", s3srv.URL("idemd"), "--store-timeout", "10s")
	o, err := blobs3.ParseURL(s3srv.URL("idemd"))
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := blobs3.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	objects := func() []string {
		var names []string
		if err := bucket.List(context.Background(), "", func(n string) bool { names = append(names, n); return true }); err != nil {
			t.Fatal(err)
		}
		return names
	}

	body := randomBody(t, 16<<20)
	completeLarge(t, p.base, "large", body)
	if got := objects(); len(got) != 1 {
		t.Fatalf("objects after one large completion: %v", got)
	}
	completeLarge(t, p.base, "purged", randomBody(t, 200<<10))
	if a := blobCall(t, p.base, http.MethodDelete, "/v1/records/purged", nil); a.Status != http.StatusNoContent {
		t.Fatalf("purge: %d %s", a.Status, a.Code)
	}
	if got := objects(); len(got) != 1 {
		t.Fatalf("after the purge: %v, want only the first result's object", got)
	}
	name := objects()[0]
	rc, err := bucket.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := io.ReadAll(rc)
	_ = rc.Close()
	if !bytes.Equal(stored, body) {
		t.Fatalf("the object holds %d bytes, not the %d completed", len(stored), len(body))
	}
	if strings.Contains(name, "large") || strings.Contains(name, engine.DefaultTenant) {
		t.Fatalf("the object's name %q shows the key or the tenant", name)
	}

	s3srv.Stop()
	a := claimKey(t, p.base, "during-outage")
	if a.Status != http.StatusCreated {
		t.Fatalf("claim: %d %s", a.Status, a.Code)
	}
	start := time.Now()
	c := completeKey(t, p.base, "during-outage", a.LeaseToken, randomBody(t, 1<<20))
	if c.Status != http.StatusServiceUnavailable || c.Code != "store_unavailable" {
		t.Fatalf("a large completion with the S3 server down: %d %q after %s, want 503 store_unavailable", c.Status, c.Code, time.Since(start))
	}
	if replay := claimKey(t, p.base, "large"); replay.Status != http.StatusServiceUnavailable {
		t.Fatalf("a replay of a large result with the S3 server down: %d %q, want 503", replay.Status, replay.Code)
	}
	completeLarge(t, p.base, "small-during-outage", []byte("small"))
	if c := completeKey(t, p.base, "during-outage", a.LeaseToken, []byte("small after all")); c.Status != http.StatusOK {
		t.Fatalf("the same lease completed small: %d %s", c.Status, c.Code)
	}
}

// The daemon started as the README's quick start starts it, with no flag but its
// address, in a working directory of its own: a 16 MiB result, put raw, comes back
// byte for byte from the raw GET and from a replayed claim, its bytes kept in
// idemd-data/blobs beside the database. --blob-store none turns that off, and a daemon
// on Redis keeps no blob store unless told one: both refuse the result with 413.
func TestQuickStartKeepsLargeResults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := buildDaemon(t)
	start := func(t *testing.T, flags ...string) (*process, string) {
		t.Helper()
		work := t.TempDir()
		addr := testdaemon.FreeAddr(t)
		p := &process{base: "http://" + addr, logs: &strings.Builder{}}
		p.cmd = exec.Command(bin, append([]string{"--listen", addr}, flags...)...)
		p.cmd.Dir = work
		p.cmd.Env = testdaemon.Env()
		p.cmd.Stdout, p.cmd.Stderr = &lockedWriter{w: p.logs}, &lockedWriter{w: p.logs}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		})
		waitReady(t, p)
		return p, work
	}
	body := randomBody(t, 16<<20)

	t.Run("the quick start", func(t *testing.T) {
		p, work := start(t)
		key := "quick/" + t.Name()
		a := claimKey(t, p.base, key)
		if a.Status != http.StatusCreated {
			t.Fatalf("claim: %d %s", a.Status, a.Code)
		}
		if code, text := putRaw(t, p.base, key, a.LeaseToken, body); code != http.StatusOK {
			t.Fatalf("PUT a 16 MiB raw result: %d %s", code, text)
		}
		code, h, got := getRaw(t, p.base, key)
		if code != http.StatusOK || h.Get("Idemd-Status") != "201" || !bytes.Equal(got, body) {
			t.Fatalf("GET the raw result: %d, %d bytes; want 200 and the %d bytes put", code, len(got), len(body))
		}
		replay := claimKey(t, p.base, key)
		if replay.Status != http.StatusOK || replay.Response == nil || replay.Response.Status != 201 || !bytes.Equal(replay.Response.Body, body) {
			t.Fatalf("the replayed claim: %d %s", replay.Status, replay.Code)
		}
		files, err := filepath.Glob(filepath.Join(work, "idemd-data", "blobs", "*", "*"))
		if err != nil || len(files) != 1 {
			t.Fatalf("files in idemd-data/blobs: %v %v, want the one blob", files, err)
		}
		if fi, err := os.Stat(files[0]); err != nil || fi.Size() != int64(len(body)) {
			t.Fatalf("the blob: %v %v", fi, err)
		}
		// The blob store's calls are metered: one put of the 16 MiB, and the raw GET's
		// and the replay's reads of them.
		metrics := scrape(t, p.base)
		for _, want := range []string{
			`idemd_blob_bytes_total{op="put"} 1.6777216e+07`,
			`idemd_blob_bytes_total{op="get"} 3.3554432e+07`,
			`idemd_blob_operation_seconds_count{op="put",outcome="ok"} 1`,
			`idemd_blob_operation_seconds_count{op="get",outcome="ok"} 2`,
		} {
			if !strings.Contains(metrics, want+"\n") {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	refused := func(t *testing.T, p *process) {
		t.Helper()
		key := "refused/" + t.Name()
		a := claimKey(t, p.base, key)
		if a.Status != http.StatusCreated {
			t.Fatalf("claim: %d %s", a.Status, a.Code)
		}
		if code, text := putRaw(t, p.base, key, a.LeaseToken, body); code != http.StatusRequestEntityTooLarge {
			t.Fatalf("PUT a 16 MiB raw result: %d %s, want 413", code, text)
		}
	}
	t.Run("none", func(t *testing.T) {
		p, work := start(t, "--blob-store", "none")
		refused(t, p)
		if _, err := os.Stat(filepath.Join(work, "idemd-data", "blobs")); !os.IsNotExist(err) {
			t.Fatalf("--blob-store none made the blob directory: %v", err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		r := testredis.Start(t)
		p, work := start(t, "--store", r.URL())
		refused(t, p)
		if _, err := os.Stat(filepath.Join(work, "idemd-data")); !os.IsNotExist(err) {
			t.Fatalf("a daemon on Redis made a data directory: %v", err)
		}
	})
}

// TestDefaultBlobDirectoryFitsTheFlags: with the embedded store's default blob
// directory, a --blob-threshold or --max-blob-bytes left at its default is fitted to
// the --max-response-bytes given, so that a daemon started with a small or large one
// starts as it did before the default; one given that does not fit is refused.
func TestDefaultBlobDirectoryFitsTheFlags(t *testing.T) {
	m := NewMain()
	if err := m.ParseFlags([]string{"--max-response-bytes", "100"}); err != nil || m.BlobThreshold != 100 || m.MaxBlobBytes != engine.DefaultMaxBlobBytes {
		t.Fatalf("--max-response-bytes 100: %v, threshold %d, max blob %d", err, m.BlobThreshold, m.MaxBlobBytes)
	}
	m = NewMain()
	if err := m.ParseFlags([]string{"--max-response-bytes", "100000000"}); err != nil || m.MaxBlobBytes != 100000000 || m.BlobThreshold != engine.DefaultBlobThreshold {
		t.Fatalf("--max-response-bytes 100000000: %v, threshold %d, max blob %d", err, m.BlobThreshold, m.MaxBlobBytes)
	}
	for _, args := range [][]string{
		{"--blob-threshold", "2000000"},
		{"--max-response-bytes", "100", "--blob-threshold", "200"},
	} {
		if err := NewMain().ParseFlags(args); err == nil {
			t.Errorf("ParseFlags(%q) accepted", args)
		}
	}
	for _, args := range [][]string{
		{"--blob-store", "none", "--max-response-bytes", "100", "--blob-threshold", "200"},
		{"--store", "redis://127.0.0.1:1/0", "--max-response-bytes", "100"},
	} {
		if err := NewMain().ParseFlags(args); err != nil {
			t.Errorf("ParseFlags(%q): %v", args, err)
		}
	}
}
