package idem_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// large answers size random bytes, the same on every run, and counts its runs.
type large struct {
	body []byte
	runs atomic.Int32
}

func (l *large) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.runs.Add(1)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(l.body)
}

// post sends an empty POST with key and reads the whole answer.
func post(t *testing.T, url, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("X-User", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// A 20 MiB answer is stored through a daemon with a blob store and replayed byte for
// byte, sealed or not, with the middleware's defaults.
func TestMiddlewareLargeResult(t *testing.T) {
	d := ownDaemon(t, "--blob-store", "file:")
	body := make([]byte, 20<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]idem.Option{
		"plain":  nil,
		"sealed": {idem.WithSealing("default", ring(t, "k-large"))},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := idem.New(d.URL, opts...)
			if err != nil {
				t.Fatal(err)
			}
			h := &large{body: body}
			var inc incidents
			url := serveWith(t, c, h, inc.option())
			key := freshKey("mw-large-" + name)
			first, got := post(t, url, key)
			if first.StatusCode != http.StatusCreated || !bytes.Equal(got, body) {
				t.Fatalf("first request: %d, %d bytes", first.StatusCode, len(got))
			}
			again, got := post(t, url, key)
			if again.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" ||
				again.Header.Get("Content-Type") != "application/octet-stream" {
				t.Fatalf("the replay: %d %v (incidents %+v)", again.StatusCode, again.Header, inc.seen)
			}
			if !bytes.Equal(got, body) {
				t.Fatalf("the replay is %d bytes and not the answer of %d", len(got), len(body))
			}
			if n := h.runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times", n)
			}
			// Through another client, past any replay cache: what idemd keeps.
			other, err := idem.New(d.URL, opts...)
			if err != nil {
				t.Fatal(err)
			}
			third, got := post(t, serveWith(t, other, h), key)
			if third.StatusCode != http.StatusCreated || !bytes.Equal(got, body) || h.runs.Load() != 1 {
				t.Fatalf("the replay through another client: %d, %d bytes, %d runs", third.StatusCode, len(got), h.runs.Load())
			}
		})
	}
}

// Without a blob store idemd refuses a result over its --max-response-bytes with 413:
// the client still gets the whole answer and a retry gets 409 response_not_stored.
func TestMiddlewareLargeResultWithoutBlobStore(t *testing.T) {
	body := make([]byte, 20<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]idem.Option{
		"plain":  nil,
		"sealed": {idem.WithSealing("default", ring(t, "k-large"))},
	} {
		t.Run(name, func(t *testing.T) {
			h := &large{body: body}
			var inc incidents
			url := serveWith(t, newClient(t, opts...), h, inc.option())
			key := freshKey("mw-large-no-blobs-" + name)
			first, got := post(t, url, key)
			if first.StatusCode != http.StatusCreated || !bytes.Equal(got, body) {
				t.Fatalf("first request: %d, %d bytes", first.StatusCode, len(got))
			}
			testenv.WaitFor(t, 10*time.Second, "the result_not_stored incident", func() bool { return inc.count(idem.IncidentResultNotStored) == 1 })
			again, got := post(t, url, key)
			if again.StatusCode != http.StatusConflict || again.Header.Get("Idempotent-Replayed") != "true" ||
				!bytes.Contains(got, []byte("response_not_stored")) || h.runs.Load() != 1 {
				t.Fatalf("the replay: %d %s, %d runs", again.StatusCode, got, h.runs.Load())
			}
		})
	}
}
