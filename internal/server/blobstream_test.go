package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/wait"
)

// streamDaemon is a daemon over the embedded store with a blob directory (threshold
// 64 KiB, results up to 64 MiB) whose blob store tells when a Put has begun to read,
// and counts the blob errors by operation.
type streamDaemon struct {
	*daemon
	dir    string
	blobs  *putWatch
	errors sync.Map // op -> *atomic.Int64
}

func newStreamDaemon(t *testing.T) *streamDaemon {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	dir := t.TempDir()
	blobs, err := blobdir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := &streamDaemon{dir: dir, blobs: &putWatch{BlobStore: blobs, reading: make(chan struct{})}}
	svc := engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute),
		engine.WithBlobs(d.blobs, engine.BlobOptions{Threshold: 64 << 10, OnError: func(op string) {
			n, _ := d.errors.LoadOrStore(op, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}}))
	hs := httptest.NewServer(server.New(svc, server.Config{
		Limits: server.Limits{MaxResponseBytes: 1 << 20, MaxBlobBytes: 64 << 20},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(hs.Close)
	d.daemon = &daemon{t: t, url: hs.URL}
	return d
}

func (d *streamDaemon) blobErrors(op string) int64 {
	n, ok := d.errors.Load(op)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// putWatch closes reading once a Put has read a byte of its blob.
type putWatch struct {
	engine.BlobStore
	reading chan struct{}
	once    sync.Once
}

func (p *putWatch) Put(ctx context.Context, name string, r io.Reader, size int64) (engine.BlobRef, error) {
	return p.BlobStore.Put(ctx, name, readHook{r, func() { p.once.Do(func() { close(p.reading) }) }}, size)
}

type readHook struct {
	r    io.Reader
	read func()
}

func (h readHook) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if n > 0 {
		h.read()
	}
	return n, err
}

// putRaw sends PUT /v1/keys/{key}/result with body as its raw body, of length size
// (-1: no Content-Length, so sent chunked).
func (d *streamDaemon) putRaw(key string, headers map[string]string, body io.Reader, size int64) answer {
	d.t.Helper()
	req, err := http.NewRequest(http.MethodPut, d.url+"/v1/keys/"+key+"/result", body)
	if err != nil {
		d.t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: raw}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

// getRaw answers GET /v1/keys/{key}/result: the answer, and the body read until it
// ended or failed.
func (d *streamDaemon) getRaw(key string) (*http.Response, []byte, error) {
	d.t.Helper()
	resp, err := http.Get(d.url + "/v1/keys/" + key + "/result")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return resp, got, err
}

// A raw PUT with a Content-Length over the threshold streams into the blob store: the
// blob store's Put reads the body while its client still holds the last part back,
// which it sends only then. The result replays byte for byte.
func TestRawPutStreamsIntoTheBlobStore(t *testing.T) {
	t.Parallel()
	d := newStreamDaemon(t)
	body := make([]byte, 4<<20)
	_, _ = rand.Read(body)
	token := d.acquire("streamed")
	pr, pw := io.Pipe()
	var heldBack atomic.Bool
	go func() {
		if _, err := pw.Write(body[:len(body)-64<<10]); err != nil {
			return
		}
		// The last 64 KiB go only once Put reads: a daemon that reads the body whole
		// before it writes the blob never gets them.
		err := wait.Until(time.Minute, func() error {
			select {
			case <-d.blobs.reading:
				return nil
			default:
				return errors.New("Put has not begun to read the body")
			}
		})
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		heldBack.Store(true)
		_, _ = pw.Write(body[len(body)-64<<10:])
		_ = pw.Close()
	}()
	a := d.putRaw("streamed", map[string]string{"Idemd-Lease-Token": token, "Idemd-Status": "200"}, pr, int64(len(body)))
	if a.status != http.StatusOK || a.str("state") != "completed" || !heldBack.Load() {
		t.Fatalf("PUT: %d %s; last part held back until Put read: %v", a.status, a.raw, heldBack.Load())
	}
	resp, got, err := d.getRaw("streamed")
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, body) || resp.ContentLength != int64(len(body)) {
		t.Fatalf("GET: %d, %d bytes (Content-Length %d), %v; want the %d bytes", resp.StatusCode, len(got), resp.ContentLength, err, len(body))
	}
}

// A raw body without a Content-Length is spooled, then stored as one with it; a
// sealed envelope streams with its head checked first; a body under a lease not held
// leaves no blob; a bad envelope is refused before anything is written.
func TestRawPutStreamedCases(t *testing.T) {
	t.Parallel()
	d := newStreamDaemon(t)
	body := make([]byte, 2<<20)
	_, _ = rand.Read(body)
	put := func(key, token string, extra map[string]string, b []byte, chunked bool) answer {
		t.Helper()
		h := map[string]string{"Idemd-Lease-Token": token, "Idemd-Status": "200"}
		for k, v := range extra {
			h[k] = v
		}
		if chunked {
			return d.putRaw(key, h, struct{ io.Reader }{bytes.NewReader(b)}, -1)
		}
		return d.putRaw(key, h, bytes.NewReader(b), int64(len(b)))
	}
	blobs := func() int {
		files, _ := filepath.Glob(filepath.Join(d.dir, "*", "*"))
		return len(files)
	}

	d.acquire("lost")
	wantProblem(t, put("lost", "0123456789abcdef0123456789abcdef", nil, body, false), http.StatusConflict, "lease_lost")
	if n := blobs(); n != 0 {
		t.Fatalf("%d blobs after a completion under a lease not held, want none", n)
	}

	for _, c := range []struct {
		name    string
		extra   map[string]string
		body    []byte
		chunked bool
		blobs   int
	}{
		{"chunked, large", nil, body, true, 1},
		{"chunked, small", nil, []byte("small"), true, 1},
		{"sealed, streamed", map[string]string{"Idemd-Sealed": "1"}, append([]byte{0xC1, 2, 3, 'k', 'i', 'd'}, body...), false, 2},
		{"headers, streamed", map[string]string{"Idemd-Result-Headers": `{"X-A":["1"]}`}, body, false, 3},
	} {
		key := freshKey("stream")
		a := put(key, d.acquire(key), c.extra, c.body, c.chunked)
		if a.status != http.StatusOK {
			t.Fatalf("%s: PUT %d %s", c.name, a.status, a.raw)
		}
		resp, got, err := d.getRaw(key)
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, c.body) {
			t.Fatalf("%s: GET %d, %d bytes, %v; want the %d bytes", c.name, resp.StatusCode, len(got), err, len(c.body))
		}
		if c.extra["Idemd-Sealed"] != resp.Header.Get("Idemd-Sealed") || c.extra["Idemd-Result-Headers"] != resp.Header.Get("Idemd-Result-Headers") {
			t.Fatalf("%s: GET headers %v", c.name, resp.Header)
		}
		if n := blobs(); n != c.blobs {
			t.Fatalf("%s: %d blobs, want %d", c.name, n, c.blobs)
		}
	}

	key := freshKey("badseal")
	token := d.acquire(key)
	wantProblem(t, put(key, token, map[string]string{"Idemd-Sealed": "1"}, body, false), http.StatusBadRequest, "invalid_request")
	wantProblem(t, put(key, token, map[string]string{"Idemd-Status": "204"}, body, false), http.StatusBadRequest, "invalid_request")
	wantProblem(t, put(key, token, nil, make([]byte, 64<<20+1), false), http.StatusRequestEntityTooLarge, "payload_too_large")
	if a := d.lookup(key); a.str("state") != "pending" || blobs() != 3 {
		t.Fatalf("after refusals the key is %s with %d blobs, want pending and no new blob", a.raw, blobs())
	}
}

// A replay of a result whose blob was altered after it was stored is never a whole
// 200 body: altered in the middle or at its end, the answer begins (its first part
// was read and sent) and its connection is cut short of the Content-Length; cut
// short or missing, it is 502 result_unavailable with nothing sent. Each is counted
// in idemd_blob_errors_total.
func TestRawGetOfADamagedBlob(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	flip := func(at int64) func(string) error {
		return func(p string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, at); err != nil {
				return err
			}
			b[0] ^= 0xff
			_, err = f.WriteAt(b, at)
			return err
		}
	}
	for _, c := range []struct {
		name   string
		damage func(string) error
		cut    bool // the answer begins and is cut; else 502 before a byte
		op     string
	}{
		{"a middle byte altered", flip(size / 2), true, "verify"},
		{"last byte altered", flip(size - 1), true, "verify"},
		{"cut short", func(p string) error { return os.Truncate(p, size/2) }, false, "verify"},
		{"missing", os.Remove, false, "get"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newStreamDaemon(t)
			body := make([]byte, size)
			_, _ = rand.Read(body)
			token := d.acquire("k")
			if a := d.putRaw("k", map[string]string{"Idemd-Lease-Token": token, "Idemd-Status": "200"}, bytes.NewReader(body), size); a.status != http.StatusOK {
				t.Fatalf("PUT: %d %s", a.status, a.raw)
			}
			files, _ := filepath.Glob(filepath.Join(d.dir, "*", "*"))
			if len(files) != 1 {
				t.Fatalf("blob files %v, want one", files)
			}
			if err := c.damage(files[0]); err != nil {
				t.Fatal(err)
			}
			resp, got, err := d.getRaw("k")
			if c.cut {
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Length") != strconv.Itoa(size) {
					t.Fatalf("GET: %d %v, want a 200 begun with its Content-Length", resp.StatusCode, resp.Header)
				}
				if err == nil || len(got) >= size {
					t.Fatalf("GET of a blob with its %s: %d of %d bytes, error %v; want the body cut short with an error", c.name, len(got), size, err)
				}
			} else {
				var p map[string]any
				if json.Unmarshal(got, &p) != nil || resp.StatusCode != http.StatusBadGateway || p["code"] != "result_unavailable" {
					t.Fatalf("GET of a blob %s: %d %.200s, want 502 result_unavailable", c.name, resp.StatusCode, got)
				}
			}
			if n := d.blobErrors(c.op); n != 1 {
				t.Fatalf("blob errors %q counted: %d, want 1", c.op, n)
			}
		})
	}
}
