package server_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/server"
)

// newBlobConsoleDaemon is a real idemd over the embedded store with a blob directory,
// results over 64 KiB kept there, the console on and the console's auth file. It
// answers the daemon and the blob directory.
func newBlobConsoleDaemon(t *testing.T) (*authDaemon, string) {
	t.Helper()
	dir := t.TempDir()
	blobs, err := blobdir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(path, []byte(consoleAuthFile()), 0o600); err != nil {
		t.Fatal(err)
	}
	keyring, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(consoleStore(t), 24*time.Hour, engine.WithStoreTimeout(time.Minute),
		engine.WithBlobs(blobs, engine.BlobOptions{Threshold: 64 << 10}))
	hs := httptest.NewServer(server.New(svc, server.Config{
		Limits:  server.Limits{MaxResponseBytes: 1 << 20, MaxBlobBytes: 16 << 20},
		Logger:  slog.New(slog.NewJSONHandler(&lockedBuffer{}, nil)),
		Console: server.Console{Enabled: true, Store: server.StoreInfo{Kind: "embedded"}},
		Auth:    keyring,
	}))
	t.Cleanup(hs.Close)
	return &authDaemon{t: t, url: hs.URL, logs: &lockedBuffer{}}, dir
}

// putResult claims key as alpha's admin and stores result as its raw result, status
// 201, a PDF.
func putResult(t *testing.T, d *authDaemon, key string, result []byte) {
	t.Helper()
	a := d.call(alphaAdmin, http.MethodPost, "/v1/claim", map[string]any{"key": key})
	expectStatus(t, "claim "+key, a, http.StatusCreated, "")
	req, err := http.NewRequest(http.MethodPut, d.url+"/v1/keys/"+url.PathEscape(key)+"/result", bytes.NewReader(result))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+alphaAdmin)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Idemd-Lease-Token", a.str("lease_token"))
	req.Header.Set("Idemd-Status", "201")
	req.Header.Set("Idemd-Result-Headers", `{"Content-Type":["application/pdf"]}`)
	expectStatus(t, "PUT the result of "+key, d.send(req), http.StatusOK, "")
}

// TestConsoleShowsLargeResultsByReference: the console shows a result kept in the blob
// store by its size and SHA-256 without its bytes, and downloads it byte for byte, in
// the tenant the token may work in; a blob altered on disk is never downloaded.
func TestConsoleShowsLargeResultsByReference(t *testing.T) {
	d, dir := newBlobConsoleDaemon(t)
	body := make([]byte, 3<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	putResult(t, d, "report", body)
	putResult(t, d, "small", []byte("a small result"))

	rec := d.call(alphaUse, http.MethodGet, query("/console/api/records", "key", "report"), nil)
	expectStatus(t, "the console's lookup", rec, http.StatusOK, "")
	byRef, _ := rec.body["response_by_reference"].(map[string]any)
	resp, _ := rec.body["response"].(map[string]any)
	switch {
	case byRef == nil || byRef["size"] != float64(len(body)) || byRef["sha256"] != hex.EncodeToString(sum[:]) || byRef["sealed"] != false:
		t.Fatalf("the console's record of a result kept by reference: %.2000s", rec.raw)
	case resp == nil || resp["status"] != float64(201) || resp["body"] != nil || strings.Contains(rec.raw, engine.BlobHeader):
		t.Fatalf("the console's response of a result kept by reference: %.2000s", rec.raw)
	case len(rec.raw) > 4096:
		t.Fatalf("the console's record is %d bytes: it carries the result", len(rec.raw))
	}
	small := d.call(alphaUse, http.MethodGet, query("/console/api/records", "key", "small"), nil)
	if _, ok := small.body["response_by_reference"]; ok || !strings.Contains(small.raw, `"body":"`) {
		t.Fatalf("the console's record of a small result: %s", small.raw)
	}

	download := func(token string, params ...string) (int, http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, d.url+query("/console/api/result", params...), nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		a := d.send(req)
		return a.status, a.header, []byte(a.raw)
	}
	code, h, got := download(alphaUse, "key", "report")
	if code != http.StatusOK || !bytes.Equal(got, body) || h.Get("Idemd-Status") != "201" ||
		!strings.HasPrefix(h.Get("Content-Disposition"), "attachment") || h.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("the download: %d, %d bytes, headers %v; want 200 and the %d bytes stored, as an attachment", code, len(got), h, len(body))
	}
	wantConsoleHeaders(t, "the download", authAnswer{header: h})
	if code, _, got := download(platformReader, "tenant", "alpha", "key", "report"); code != http.StatusOK || !bytes.Equal(got, body) {
		t.Fatalf("a platform token's download in another tenant: %d, %d bytes", code, len(got))
	}
	if code, _, got := download(alphaUse, "key", "small"); code != http.StatusOK || string(got) != "a small result" {
		t.Fatalf("the download of a small result: %d %q", code, got)
	}
	for _, c := range []struct {
		name   string
		token  string
		params []string
		status int
	}{
		{"another tenant's user", betaUse, []string{"tenant", "alpha", "key", "report"}, http.StatusForbidden},
		{"another tenant's user in its own tenant", betaUse, []string{"key", "report"}, http.StatusNotFound},
		{"no token", "", []string{"key", "report"}, http.StatusUnauthorized},
		{"an unknown parameter", alphaUse, []string{"key", "report", "as", "pdf"}, http.StatusBadRequest},
		{"no key", alphaUse, nil, http.StatusBadRequest},
	} {
		code, h, got := download(c.token, c.params...)
		if code != c.status || bytes.Contains(got, body[:64]) || h.Get("Content-Disposition") != "" {
			t.Errorf("%s: %d, %d bytes, Content-Disposition %q; want %d and none of the result", c.name, code, len(got), h.Get("Content-Disposition"), c.status)
		}
	}

	files, err := filepath.Glob(filepath.Join(dir, "*", "*"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the blob directory: %v %v", files, err)
	}
	// An altered byte is found only once the whole blob has streamed: the download is
	// cut short of its Content-Length, so that no client takes it for the result.
	altered := bytes.Clone(body)
	altered[len(altered)/2] ^= 0x01
	if err := os.WriteFile(files[0], altered, 0o600); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, d.url+query("/console/api/result", "key", "report"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+alphaUse)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		got, readErr := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK && (readErr == nil || len(got) >= len(body)) {
			t.Fatalf("the download of an altered blob: 200 with %d bytes read whole (%v); want it cut short", len(got), readErr)
		}
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("the download of an altered blob: %d", resp.StatusCode)
		}
	}
	// A blob of another size than its reference is known before a byte is sent: 502.
	if err := os.WriteFile(files[0], altered[:len(altered)-1], 0o600); err != nil {
		t.Fatal(err)
	}
	code, h, got = download(alphaUse, "key", "report")
	if code != http.StatusBadGateway || !strings.Contains(string(got), "result_unavailable") || bytes.Contains(got, altered[:64]) || h.Get("Content-Disposition") != "" {
		t.Fatalf("the download of a blob cut short: %d %.200q; want 502 result_unavailable and none of its bytes", code, got)
	}
	if rec := d.call(alphaUse, http.MethodGet, query("/console/api/records", "key", "report"), nil); rec.status != http.StatusOK {
		t.Fatalf("the console's lookup of a record whose blob is altered: %d %s; want the record, with its reference", rec.status, rec.raw)
	}
}

// TestConsoleLargeResultInBrowser: the page shows a result kept by reference by its
// size and SHA-256, with its headers and no body, and its download button fetches it
// with the token; a blob altered on disk makes the download say why it failed.
func TestConsoleLargeResultInBrowser(t *testing.T) {
	browser := startBrowser(t)
	d, dir := newBlobConsoleDaemon(t)
	body := make([]byte, 2<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	putResult(t, d, "invoice-77.pdf", body)

	ctx := tab(t, browser, d, alphaUse)
	run(t, ctx, chromedp.SendKeys(chromedp.CSS("#key"), "invoice-77.pdf"), chromedp.Click(chromedp.CSS("#lookup")),
		chromedp.WaitVisible(chromedp.CSS("#record")))
	if got := textOf(t, ctx, "#f-by-reference"); got != fmt.Sprintf("by reference, in the blob store: %d bytes", len(body)) {
		t.Errorf("#f-by-reference shows %q", got)
	}
	if got := textOf(t, ctx, "#f-sha256"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("#f-sha256 shows %q", got)
	}
	if got := textOf(t, ctx, "#f-headers"); !strings.Contains(got, "application/pdf") || strings.Contains(got, engine.BlobHeader) {
		t.Errorf("the headers show %q", got)
	}
	if eval[bool](t, ctx, `document.getElementById('f-body') !== null`) {
		t.Error("a result kept by reference is shown with a body")
	}
	run(t, ctx, chromedp.Click(chromedp.CSS("#download")))
	waitFor(t, ctx, `document.getElementById('download-note').textContent.startsWith('downloaded') || document.getElementById('download-note').textContent.startsWith('Not')`)
	if got, want := textOf(t, ctx, "#download-note"), fmt.Sprintf("downloaded %d bytes", len(body)); got != want {
		t.Errorf("the download says %q, want %q", got, want)
	}

	files, err := filepath.Glob(filepath.Join(dir, "*", "*"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the blob directory: %v %v", files, err)
	}
	if err := os.Truncate(files[0], 1000); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Click(chromedp.CSS("#download")))
	waitFor(t, ctx, `document.getElementById('download-note').textContent.startsWith('Not')`)
	if got := textOf(t, ctx, "#download-note"); !strings.Contains(got, "502 result_unavailable") {
		t.Errorf("the download of a short blob says %q", got)
	}
}
