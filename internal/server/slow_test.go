package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/wait"
)

// slowDaemon is a daemon with the body timeout given and a short write timeout, over
// the embedded store.
func slowDaemon(t *testing.T, authn server.Authenticator, bodyTimeout time.Duration) *daemon {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	cfg := server.Config{
		Limits:       server.Limits{MaxResponseBytes: 32 << 20},
		BodyTimeout:  bodyTimeout,
		WriteTimeout: 300 * time.Millisecond,
	}
	if authn != nil {
		cfg.Auth = authn
	}
	// What these tests check is the HTTP deadlines. Committing their 24 MiB response
	// can outlast the default store deadline on a busy machine, which would answer 503
	// (TestFrozenStoreAnswersAtItsDeadline and the embedded store's own tests cover
	// that), so the store deadline is set well out of their way.
	hs := httptest.NewServer(server.New(engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute)), cfg))
	t.Cleanup(hs.Close)
	return &daemon{t: t, url: hs.URL}
}

// trickle sends a request whose body goes one byte every 20 ms, and reports whether
// the daemon hung up before the body was complete, and what it answered.
func trickle(t *testing.T, d *daemon, body string) (cutOff bool, resp *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	answered := make(chan *http.Response, 1)
	hungUp := make(chan struct{})
	go func() {
		defer close(answered)
		r := bufio.NewReader(conn)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		answered <- resp
		// io.Copy returns nil at EOF: the daemon closed the connection.
		if _, err := io.Copy(io.Discard, r); err == nil {
			close(hungUp)
		}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < len(body) && !cutOff; i++ {
		select {
		case <-hungUp:
			cutOff = true
			continue
		default:
		}
		if _, err := conn.Write([]byte{body[i]}); err != nil {
			cutOff = true
		}
		<-tick.C
	}
	// Let the reader see what came back, without waiting for an idle connection.
	_ = conn.SetReadDeadline(time.Now().Add(wait.Scale(10 * time.Second)))
	return cutOff, <-answered
}

// TestSlowClientsDoNotHoldConnections: a client trickling its body, with or without a
// token, and a client that never reads its answer each lose their connection once the
// body or write timeout passes, so a few hundred of them cannot starve the daemon of
// descriptors. A claim waiting longer than the body timeout is not cut off.
func TestSlowClientsDoNotHoldConnections(t *testing.T) {
	body := `{"key":"trickled","lease_ms":60000}` + strings.Repeat(" ", 100)

	t.Run("trickled body", func(t *testing.T) {
		d := slowDaemon(t, nil, 300*time.Millisecond)
		cutOff, resp := trickle(t, d, body)
		if !cutOff {
			t.Fatalf("the daemon kept the connection for the whole trickled body (answer %v)", resp)
		}
		if resp == nil || resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("answer to a trickled body: %v, want 408", resp)
		}
		if l := d.lookup("trickled"); l.status != http.StatusNotFound {
			t.Fatalf("the trickled claim was carried out: %s", l.raw)
		}
	})

	t.Run("trickled body without a token", func(t *testing.T) {
		cfg, err := auth.Parse([]byte("tenants: {a: {}}\ntokens:\n  - {tenant: a, scopes: [use], sha256: " + tokenHash("t") + "}\n"))
		if err != nil {
			t.Fatal(err)
		}
		d := slowDaemon(t, cfg, 300*time.Millisecond)
		cutOff, resp := trickle(t, d, body)
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("answer without a token: %v, want 401", resp)
		}
		if !cutOff {
			t.Fatal("after its 401 the daemon kept reading the trickled body to its end")
		}
	})

	t.Run("reader that never reads", func(t *testing.T) {
		// The test's own upload of the large response must not trip the body timeout.
		d := slowDaemon(t, nil, time.Minute)
		key := freshKey("big")
		token := d.acquire(key)
		big := make([]byte, 24<<20) // far more than the loopback socket buffers hold
		if a := d.complete(key, token, 200, big); a.status != 200 {
			t.Fatalf("complete: %d %s", a.status, a.raw)
		}
		conn, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /v1/records/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", key)
		// The lookup is over, on the daemon's side, without this client reading a byte.
		waitForMetric(t, d, `idemd_requests_total{endpoint="GET /v1/records/:key",outcome="client_closed_request",tenant="default"} 1`)
		n, _ := io.Copy(io.Discard, conn)
		if n >= int64(len(big)) {
			t.Fatalf("read %d bytes: the whole answer was sent to a client that did not read", n)
		}
	})

	t.Run("a wait longer than the body timeout", func(t *testing.T) {
		d := slowDaemon(t, nil, 300*time.Millisecond)
		key := freshKey("wait")
		d.acquire(key, "lease_ms", 1000)
		a := d.claim(map[string]any{"key": key, "wait_ms": 5000})
		if a.status != http.StatusCreated {
			t.Fatalf("waiting claim: %d %s, want 201 once the lease ran out", a.status, a.raw)
		}
	})
}
