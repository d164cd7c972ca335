package server_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// envelope is a sealed result's bytes as far as idemd reads them: the head (marker,
// version, key id) and a body it cannot open.
func envelope(version byte, keyID string, rest int) []byte {
	b := []byte{0xC1, version, byte(len(keyID))}
	b = append(b, keyID...)
	return append(b, bytes.Repeat([]byte{0x5A}, rest)...)
}

// TestSealedResponses: a sealed response is stored and answered byte for byte with its
// status, on every status (a sealed 204 keeps headers a plain 204 has no body for), by
// complete, a fail release, a replaying claim and a lookup.
func TestSealedResponses(t *testing.T) { forEachStore(t, testSealedResponses) }

func testSealedResponses(t *testing.T, d *daemon) {
	for i, status := range []int{201, 204, 422, 500} {
		for _, path := range []string{"/v1/complete", "/v1/release"} {
			// Version 2 is what clients seal; version 1 envelopes are still stored. The
			// shortest holds nothing: a failure sealed without a response.
			env := envelope(byte(1+i%2), "k-2026.11", 16+12+16+40*(status%5))
			key := freshKey("sealed")
			req := map[string]any{"key": key, "lease_token": d.acquire(key),
				"response": map[string]any{"status": status, "sealed": env}}
			if path == "/v1/release" {
				req["mode"] = "fail"
			}
			if a := d.post(path, req); a.status != http.StatusOK {
				t.Fatalf("%s with a sealed %d: %d %s", path, status, a.status, a.raw)
			}
			for what, a := range map[string]answer{"replay": d.claim(map[string]any{"key": key}), "lookup": d.lookup(key)} {
				r, _ := a.body["response"].(map[string]any)
				got, _ := base64.StdEncoding.DecodeString(fmt.Sprint(r["sealed"]))
				if r == nil || r["status"] != float64(status) || !bytes.Equal(got, env) || r["headers"] != nil || r["body"] != nil {
					t.Fatalf("%s after %s: %s, want status %d and the envelope alone", what, path, a.raw, status)
				}
			}
		}
	}
}

// TestSealedResponsesAreValidated: idemd refuses what no client could open, and a plain
// response that takes the name of the seal's mark; each refusal names the field and
// stores nothing.
func TestSealedResponsesAreValidated(t *testing.T) { forEachStore(t, testSealedResponsesAreValidated) }

func testSealedResponsesAreValidated(t *testing.T, d *daemon) {
	good := envelope(2, "k1", 44)
	for _, tc := range []struct {
		name     string
		response map[string]any
		detail   string
	}{
		{"another first byte", map[string]any{"status": 200, "sealed": append([]byte{0xC2}, good[1:]...)},
			"response.sealed: not a sealed envelope: its first byte is 0xC2, where an envelope's is 0xC1"},
		{"an envelope's head alone", map[string]any{"status": 200, "sealed": good[:2]},
			"response.sealed: 2 bytes, shorter than an envelope's head"},
		{"headers beside the envelope", map[string]any{"status": 200, "sealed": good, "headers": map[string][]string{"X-A": {"1"}}}, "response.headers"},
		{"a body beside the envelope", map[string]any{"status": 200, "sealed": good, "body": []byte("x")}, "response.body"},
		{"an empty envelope", map[string]any{"status": 200, "sealed": []byte{}}, "response.sealed"},
		{"not an envelope", map[string]any{"status": 200, "sealed": []byte(`{"card":"4242"}`)}, "response.sealed"},
		{"an unknown version", map[string]any{"status": 200, "sealed": envelope(3, "k1", 44)}, "response.sealed: envelope version 3; this daemon knows versions 1 and 2"},
		{"version 0", map[string]any{"status": 200, "sealed": envelope(0, "k1", 44)}, "response.sealed: envelope version 0"},
		{"an empty key id", map[string]any{"status": 200, "sealed": envelope(2, "", 44)}, "response.sealed"},
		{"a key id of 33 bytes", map[string]any{"status": 200, "sealed": envelope(2, strings.Repeat("k", 33), 44)}, "response.sealed"},
		{"a key id with a slash", map[string]any{"status": 200, "sealed": envelope(2, "k/1", 44)}, "response.sealed"},
		{"shorter than salt, nonce and tag", map[string]any{"status": 200, "sealed": envelope(2, "k1", 43)}, "response.sealed: 48 bytes, shorter than the 49 of the shortest envelope with a key id of 2 bytes"},
		{"a plain response with the mark's name", map[string]any{"status": 200, "headers": map[string][]string{"idemd-sealed": {"1"}}, "body": good}, `response.headers["idemd-sealed"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := freshKey("sealed-bad")
			a := d.post("/v1/complete", map[string]any{"key": key, "lease_token": d.acquire(key), "response": tc.response})
			wantProblem(t, a, http.StatusBadRequest, "invalid_request")
			if !strings.Contains(a.str("detail"), tc.detail) {
				t.Errorf("detail %q does not name %s", a.str("detail"), tc.detail)
			}
			if l := d.lookup(key); l.str("state") != "pending" {
				t.Errorf("a refused response changed the record: %s", l.raw)
			}
		})
	}
}
