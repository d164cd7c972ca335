package idem_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// dropRawUploads is a relay in front of the shared daemon that passes every request
// but the raw upload of a result, whose connection it closes unanswered: as a daemon
// without a blob store may do to a large body it refuses before reading it.
func dropRawUploads(t *testing.T) string {
	t.Helper()
	target, err := url.Parse(daemonURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/result") {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestMiddlewareLargeSealedResultUnanswered: a sealed answer whose body is under 1 MiB
// but whose envelope is over it goes as the raw upload, as every client sends what it
// stores; when that upload gets no answer, the middleware treats it as the large
// result it sent (R10a: response_not_stored), not as a completion that failed (R13,
// which would leave the key claimed to run the handler again). A plain body of the
// same size goes in JSON and is stored.
func TestMiddlewareLargeSealedResultUnanswered(t *testing.T) {
	relay := dropRawUploads(t)
	// Sealing adds about 64 bytes: the envelope of this body is over 1 MiB.
	body := bytes.Repeat([]byte("s"), 1<<20-32)
	for _, sealed := range []bool{true, false} {
		name := map[bool]string{true: "sealed", false: "plain"}[sealed]
		t.Run(name, func(t *testing.T) {
			opts := []idem.Option{idem.WithRetries(0)}
			if sealed {
				opts = append(opts, idem.WithSealing("default", ring(t, "k-raw")))
			}
			c, err := idem.New(relay, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var inc incidents
			url := serveWith(t, c, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(body)
			}), inc.option())
			key := freshKey("mw-raw-" + name)
			if r := (call{key: key, body: `{}`}).do(t, url); r.status != http.StatusCreated || len(r.body) != len(body) {
				t.Fatalf("answer: %d, %d bytes", r.status, len(r.body))
			}
			if !sealed {
				// Under 1 MiB in JSON: stored, and replayed.
				testenv.WaitFor(t, 10*time.Second, "the plain result to be stored", func() bool {
					r := (call{key: key, body: `{}`}).do(t, url)
					return r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "true"
				})
				if n := inc.count(idem.IncidentResultNotStored) + inc.count(idem.IncidentCompleteFailed); n != 0 {
					t.Fatalf("incidents %v for a plain result sent in JSON", &inc)
				}
				return
			}
			testenv.WaitFor(t, 10*time.Second, "the result_not_stored incident", func() bool {
				return inc.count(idem.IncidentResultNotStored) == 1
			})
			if n := inc.count(idem.IncidentCompleteFailed); n != 0 {
				t.Fatalf("%d complete_failed incidents, want the unanswered raw upload taken as response_not_stored", n)
			}
			if r := (call{key: key, body: `{}`}).do(t, url); r.status != http.StatusConflict || r.problemCode() != "response_not_stored" {
				t.Fatalf("a retry: %d %q, want 409 response_not_stored", r.status, r.body)
			}
		})
	}
}
