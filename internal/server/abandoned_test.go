package server_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/wait"
)

func TestAbandonedFeed(t *testing.T) { forEachStore(t, testAbandonedFeed) }

// testAbandonedFeed reads the feed over HTTP page by page: the keys under the prefix
// whose lease ran out, with what the contract shows of each, and not a key whose
// lease is live or that is finished.
func testAbandonedFeed(t *testing.T, d *daemon) {
	prefix := freshKey("feed") + "/"
	var want []string
	for _, k := range []string{"a", "b", "c"} {
		d.acquire(prefix+k, "lease_ms", 100, "owner", "worker-7")
		want = append(want, prefix+k)
	}
	tok := d.acquire(prefix+"done", "lease_ms", 100)
	if c := d.complete(prefix+"done", tok, 200, nil); c.status != 200 {
		t.Fatalf("complete: %d %s", c.status, c.raw)
	}
	d.acquire(prefix+"live", "lease_ms", 60000)
	d.acquire(freshKey("elsewhere"), "lease_ms", 100)

	feed := func(query url.Values) answer {
		return d.do(http.MethodGet, "/v1/abandoned?"+query.Encode(), "", nil)
	}
	var got []string
	wait.For(t, 10*time.Second, "the three short leases to run out", func() bool {
		got = got[:0]
		q := url.Values{"prefix": {prefix}, "limit": {"1"}}
		for pages := 0; pages < 20; pages++ {
			a := feed(q)
			if a.status != 200 {
				t.Fatalf("feed: %d %s", a.status, a.raw)
			}
			keys, _ := a.body["keys"].([]any)
			if len(keys) > 1 {
				t.Fatalf("a page of %d keys over its limit of 1: %s", len(keys), a.raw)
			}
			for _, k := range keys {
				k := k.(map[string]any)
				if k["attempt"] != float64(1) || k["owner"] != "worker-7" || k["lease_expired_at"] == nil || k["recovery_point"] != nil {
					t.Fatalf("abandoned key %v", k)
				}
				got = append(got, k["key"].(string))
			}
			next := a.str("next_cursor")
			if next == "" {
				break
			}
			q.Set("cursor", next)
		}
		return len(got) == len(want)
	})
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("abandoned %q, want %q", got, want)
	}
	if a := feed(url.Values{"prefix": {prefix}, "older_than_ms": {"3600000"}}); a.status != 200 || len(a.body["keys"].([]any)) != 0 {
		t.Fatalf("leases that ran out over an hour ago: %d %s, want none", a.status, a.raw)
	}

	bad := []struct {
		name   string
		query  url.Values
		detail string
	}{
		{"prefix too long", url.Values{"prefix": {strings.Repeat("p", 256)}}, "prefix"},
		{"limit zero", url.Values{"limit": {"0"}}, "limit"},
		{"limit over the maximum", url.Values{"limit": {"1001"}}, "limit"},
		{"limit not a number", url.Values{"limit": {"ten"}}, "limit"},
		{"older_than_ms negative", url.Values{"older_than_ms": {"-1"}}, "older_than_ms"},
		{"cursor not base64url", url.Values{"cursor": {"!!!"}}, "cursor"},
		{"cursor of no feed", url.Values{"prefix": {prefix}, "cursor": {base64.RawURLEncoding.EncodeToString([]byte("\xffnot a cursor"))}}, "cursor"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			a := feed(tc.query)
			wantProblem(t, a, 400, "invalid_request")
			if !strings.Contains(a.str("detail"), tc.detail) {
				t.Fatalf("detail %q does not name %s", a.str("detail"), tc.detail)
			}
		})
	}
}

// TestAbandonedFeedIsPerTenant: a tenant's feed never shows another's keys, whatever
// prefix it asks for.
func TestAbandonedFeedIsPerTenant(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	claim := d.call(alphaUse, http.MethodPost, "/v1/claim", map[string]any{"key": "order-9", "lease_ms": 100})
	expectStatus(t, "alpha claims", claim, http.StatusCreated, "")
	keys := func(token string) []any {
		a := d.call(token, http.MethodGet, "/v1/abandoned?prefix=order-", nil)
		expectStatus(t, "feed", a, http.StatusOK, "")
		k, _ := a.body["keys"].([]any)
		return k
	}
	wait.For(t, 10*time.Second, "alpha's feed to show order-9", func() bool { return len(keys(alphaUse)) == 1 })
	if k := keys(betaUse); len(k) != 0 {
		t.Fatalf("beta's feed shows %v", k)
	}
}

func TestAbandonedMetric(t *testing.T) { forEachStore(t, testAbandonedMetric) }

// testAbandonedMetric: once two leases ran out, the first scrape counts them for the
// tenant, and says how long ago the older ran out.
func testAbandonedMetric(t *testing.T, d *daemon) {
	for range 2 {
		d.acquire(freshKey("metric"), "lease_ms", 100)
	}
	wait.For(t, 10*time.Second, "both leases to run out", func() bool {
		a := d.do(http.MethodGet, "/v1/abandoned", "", nil)
		keys, _ := a.body["keys"].([]any)
		return len(keys) == 2
	})
	text := d.metricsText()
	if !strings.Contains(text, "idemd_abandoned_keys{tenant=\"default\"} 2\n") {
		t.Fatalf("metrics lack idemd_abandoned_keys{tenant=\"default\"} 2:\n%s", grepLines(text, "idemd_abandoned"))
	}
	if strings.Contains(text, "idemd_abandoned_oldest_seconds{tenant=\"default\"} 0\n") || !strings.Contains(text, "idemd_abandoned_oldest_seconds{tenant=\"default\"} ") {
		t.Fatalf("the oldest abandoned key's age is missing or zero:\n%s", grepLines(text, "idemd_abandoned"))
	}
}
