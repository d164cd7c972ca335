package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	idem "github.com/idemd/idemd/clients/go"
)

// TestLookupSealed: a result and a recovery point sealed by their client show as sealed,
// with the key that opens them, and open with the ring from --seal-keys or
// $IDEMD_SEAL_KEYS; a ring without that key shows them sealed and exits 1.
func TestLookupSealed(t *testing.T) {
	base := startDaemon(t, "--data-dir", t.TempDir())
	key := func(b byte) string {
		return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(rune(b)), 32)))
	}
	ringText := "k-2026-11=" + key('a') + "\n"
	ring, err := idem.ParseKeyRing(ringText)
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.New(base, idem.WithSealing("payments", ring))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done, err := c.Claim(ctx, "order-1", idem.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, "order-1", done.Token, idem.Response{Status: 201,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"card":"4242"}`)}); err != nil {
		t.Fatal(err)
	}
	pending, err := c.Claim(ctx, "order-2", idem.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RecordRecoveryPoint(ctx, "order-2", pending.Token, "charged", []byte("ch_secret")); err != nil {
		t.Fatal(err)
	}

	env := map[string]string{"IDEMD_URL": base}
	r := idemctl(env, "lookup", "order-1")
	expect(t, r, exitOK, "lookup without a ring")
	if !hasRow(r.stdout, "result", `sealed with key "k-2026-11"`) || strings.Contains(r.stdout, "4242") {
		t.Fatalf("lookup without a ring:\n%s", r.stdout)
	}
	r = idemctl(env, "lookup", "order-1", "--json")
	expect(t, r, exitOK, "lookup --json without a ring")
	if resp, _ := r.json(t)["response"].(map[string]any); resp["status"] != float64(201) || resp["sealed"] == nil || resp["body"] != nil {
		t.Fatalf("lookup --json without a ring: %s", r.stdout)
	}
	r = idemctl(env, "lookup", "order-2")
	expect(t, r, exitOK, "lookup of a sealed point without a ring")
	if !hasRow(r.stdout, "point data", `sealed with key "k-2026-11"`) || strings.Contains(r.stdout, "ch_secret") {
		t.Fatalf("lookup of a sealed point without a ring:\n%s", r.stdout)
	}

	file := filepath.Join(t.TempDir(), "ring")
	writeFile(t, file, "# the payments ring\nk-2027-01="+key('b')+"\n"+ringText)
	for name, args := range map[string][]string{
		"--seal-keys":     {"lookup", "order-1", "--seal-keys", file, "--seal-tenant", "payments"},
		"IDEMD_SEAL_KEYS": {"lookup", "order-1"},
	} {
		env := map[string]string{"IDEMD_URL": base, "IDEMD_SEAL_KEYS": ringText, "IDEMD_SEAL_TENANT": "payments"}
		r = idemctl(env, args...)
		expect(t, r, exitOK, "lookup with the ring from "+name)
		if !strings.Contains(r.stdout, `"{\"card\":\"4242\"}"`) || !strings.Contains(r.stdout, "Content-Type: application/json") {
			t.Fatalf("lookup with the ring from %s:\n%s", name, r.stdout)
		}
	}
	r = idemctl(map[string]string{"IDEMD_URL": base, "IDEMD_SEAL_KEYS": ringText, "IDEMD_SEAL_TENANT": "payments"}, "lookup", "order-2")
	expect(t, r, exitOK, "lookup of a sealed point with the ring")
	if !strings.Contains(r.stdout, `"ch_secret"`) {
		t.Fatalf("lookup of a sealed point with the ring:\n%s", r.stdout)
	}

	other := map[string]string{"IDEMD_URL": base, "IDEMD_SEAL_KEYS": "k-2027-01=" + key('b'), "IDEMD_SEAL_TENANT": "payments"}
	r = idemctl(other, "lookup", "order-1")
	expect(t, r, exitRefused, "lookup with a ring without the key")
	if !hasRow(r.stdout, "result", `sealed with key "k-2026-11"`) || !hasRow(r.stdout, "not opened", "unknown_key") && !hasRow(r.stdout, "not opened", "does not hold") ||
		strings.Contains(r.stdout, "4242") {
		t.Fatalf("lookup with a ring without the key:\n%s", r.stdout)
	}
	r = idemctl(map[string]string{"IDEMD_URL": base, "IDEMD_SEAL_KEYS": "k1=short"}, "lookup", "order-1")
	expect(t, r, exitUsage, "lookup with a ring that does not parse")
}

// hasRow says whether a table printed by idemctl has a row name whose value holds want.
func hasRow(out, name, want string) bool {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok && strings.Contains(v, want) {
			return true
		}
	}
	return false
}
