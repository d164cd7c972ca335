package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/server"
)

// TestOpenDaemonAnswersOnlyItsHosts checks the defence against DNS rebinding: an open
// daemon answers a request only when its Host is an IP literal, localhost, or a name
// it was given, so that a web page cannot reach it through a name the page's site
// controls; and a daemon with an auth file answers any Host, since such a page holds
// no token.
func TestOpenDaemonAnswersOnlyItsHosts(t *testing.T) {
	t.Parallel()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv := server.New(engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{
		AllowedHosts: []string{"idemd.platform.svc", "Idemd.Internal."},
	})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)

	send := func(t *testing.T, host, method, path, body string) (int, map[string]any, string) {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var problem map[string]any
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			if err := json.Unmarshal(raw, &problem); err != nil {
				t.Fatalf("problem+json that does not parse: %q", raw)
			}
		}
		return resp.StatusCode, problem, string(raw)
	}

	answered := []struct{ name, host string }{
		{"an IPv4 literal with a port", "127.0.0.1:8080"},
		{"an IPv4 literal without one", "10.2.3.4"},
		{"an IPv6 literal with a port", "[::1]:8080"},
		{"an IPv6 literal without one", "[fd00::12]"},
		{"localhost with a port", "localhost:8080"},
		{"localhost in capitals without one", "LOCALHOST"},
		{"localhost with the root's dot", "localhost."},
		{"a name it was given, with a port", "idemd.platform.svc:8080"},
		{"a name it was given, in another case and with the root's dot", "IDEMD.internal."},
		{"a name given in capitals with a dot, as sent plainly", "idemd.internal"},
	}
	for _, c := range answered {
		t.Run(c.name, func(t *testing.T) {
			key := "host-" + strings.NewReplacer(":", "-", "[", "", "]", "").Replace(c.host)
			if status, _, raw := send(t, c.host, http.MethodPost, "/v1/claim", `{"key":"`+key+`"}`); status != http.StatusCreated {
				t.Fatalf("Host %q: claim answered %d, want 201: %s", c.host, status, raw)
			}
			if status, _, raw := send(t, c.host, http.MethodDelete, "/v1/records/"+key, ""); status != http.StatusNoContent {
				t.Fatalf("Host %q: purge answered %d, want 204: %s", c.host, status, raw)
			}
		})
	}

	refused := []struct{ name, host string }{
		{"a name it was not given", "attacker.example:8080"},
		{"a name it was not given, without a port", "rebind.attacker.example"},
		{"a name that ends like a given one", "evil-idemd.platform.svc"},
		{"a name under a given one", "x.idemd.internal"},
		{"a name that starts with localhost", "localhost.attacker.example"},
		{"a number that is no IP literal", "2130706433"},
	}
	// Left by the test before: a refused purge must not reach it.
	if status, _, raw := send(t, "127.0.0.1", http.MethodPost, "/v1/claim", `{"key":"kept"}`); status != http.StatusCreated {
		t.Fatalf("claim: %d %s", status, raw)
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			for _, r := range []struct{ method, path, body string }{
				{http.MethodPost, "/v1/claim", `{"key":"refused"}`},
				{http.MethodGet, "/v1/records/kept", ""},
				{http.MethodDelete, "/v1/records/kept", ""},
			} {
				status, problem, raw := send(t, c.host, r.method, r.path, r.body)
				if status != http.StatusForbidden || problem["code"] != "forbidden" || !strings.Contains(problem["detail"].(string), c.host) {
					t.Fatalf("Host %q: %s %s answered %d %s, want 403 forbidden naming the Host", c.host, r.method, r.path, status, raw)
				}
			}
		})
	}
	if status, _, raw := send(t, "127.0.0.1", http.MethodGet, "/v1/records/kept", ""); status != http.StatusOK {
		t.Fatalf("after the refused purges the record is gone: %d %s", status, raw)
	}
	if status, _, _ := send(t, "127.0.0.1", http.MethodGet, "/v1/records/refused", ""); status != http.StatusNotFound {
		t.Fatalf("a refused claim stored a record: %d", status)
	}

	// Probes, scrapers and the contract reveal nothing about records, and answer any Host
	// as they answer without a token.
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.yaml"} {
		if status, _, raw := send(t, "idemd:8080", http.MethodGet, path, ""); status != http.StatusOK {
			t.Errorf("%s by a name it was not given: %d %s", path, status, raw)
		}
	}

	t.Run("with an auth file any Host works with a token", func(t *testing.T) {
		d := newAuthDaemon(t)
		req, err := http.NewRequest(http.MethodPost, d.url+"/v1/claim", bytes.NewReader([]byte(`{"key":"by-name"}`)))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "idemd.attacker.example"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+alphaUse)
		expectStatus(t, "a claim by any name with a token", d.send(req), http.StatusCreated, "")
	})
}
