package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/wait"
)

// TestAbandoned lists the keys whose holders left them pending, as text and as JSON,
// every page or one, and shows a key's recovery point in lookup.
func TestAbandoned(t *testing.T) {
	base := startDaemon(t)
	env := map[string]string{"IDEMD_URL": base}
	var tokens []string
	for _, key := range []string{"refunds/1", "refunds/2", "orders/1"} {
		r := idemctl(env, "claim", key, "--lease", "100ms", "--owner", "worker-3", "--json")
		expect(t, r, exitOK, "claim "+key)
		tokens = append(tokens, r.json(t)["lease_token"].(string))
	}
	body := `{"key":"refunds/2","lease_token":"` + tokens[1] + `","name":"refunded","data":"cmVfMg=="}`
	resp, err := http.Post(base+"/v1/recovery-point", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("recovery point: %v %v", resp, err)
	}
	resp.Body.Close()

	var keys []any
	wait.For(t, 10*time.Second, "both refunds' leases to run out", func() bool {
		r := idemctl(env, "abandoned", "--prefix", "refunds/", "--json")
		expect(t, r, exitOK, "abandoned --json")
		keys, _ = r.json(t)["keys"].([]any)
		return len(keys) == 2
	})
	for i, k := range keys {
		k := k.(map[string]any)
		point := map[int]any{0: nil, 1: "refunded"}[i]
		if !strings.HasPrefix(k["key"].(string), "refunds/") || k["attempt"] != float64(1) || k["owner"] != "worker-3" || k["recovery_point"] != point {
			t.Fatalf("abandoned key %d: %v", i, k)
		}
	}
	r := idemctl(env, "abandoned", "--prefix", "refunds/")
	expect(t, r, exitOK, "abandoned")
	if !strings.Contains(r.stdout, `"refunds/2"`) || !strings.Contains(r.stdout, `"refunded"`) || !strings.Contains(r.stderr, "2 abandoned keys") {
		t.Fatalf("abandoned as text:\n%s%s", r.stdout, r.stderr)
	}
	r = idemctl(env, "abandoned", "--prefix", "refunds/", "--limit", "1", "--json")
	expect(t, r, exitOK, "abandoned --limit 1")
	page := r.json(t)
	if len(page["keys"].([]any)) != 1 || page["next_cursor"] == nil {
		t.Fatalf("one page of one key: %v", page)
	}
	r = idemctl(env, "abandoned", "--prefix", "refunds/", "--limit", "1", "--cursor", page["next_cursor"].(string), "--json")
	expect(t, r, exitOK, "abandoned --cursor")
	if k := r.json(t)["keys"].([]any); len(k) != 1 || k[0].(map[string]any)["key"] == page["keys"].([]any)[0].(map[string]any)["key"] {
		t.Fatalf("the second page: %s", r.stdout)
	}
	expect(t, idemctl(env, "abandoned", "--limit", "1001"), exitUsage, "abandoned --limit 1001")
	expect(t, idemctl(env, "abandoned", "--limit", "1", "--cursor", "!!"), exitRefused, "abandoned with a malformed cursor")

	r = idemctl(env, "lookup", "refunds/2")
	expect(t, r, exitOK, "lookup")
	if !strings.Contains(r.stdout, `"refunded" by attempt 1`) || !strings.Contains(r.stdout, `"re_2"`) {
		t.Fatalf("lookup does not show the recovery point:\n%s", r.stdout)
	}
	r = idemctl(env, "lookup", "refunds/2", "--json")
	expect(t, r, exitOK, "lookup --json")
	if p, _ := r.json(t)["recovery_point"].(map[string]any); p == nil || p["name"] != "refunded" || p["data"] != "cmVfMg==" {
		t.Fatalf("lookup --json: %s", r.stdout)
	}
}
