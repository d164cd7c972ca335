package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// metricsText is the daemon's /metrics page.
func (d *daemon) metricsText() string {
	d.t.Helper()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	return string(b)
}

// TestMetricLabelsAreBounded sends requests with made-up methods and paths: none of
// them may become a label value, or any client could grow the metrics without bound.
func TestMetricLabelsAreBounded(t *testing.T) {
	d, _ := redisDaemon(t)
	for _, path := range []string{"/healthz", "/v1/claim", "/v1/records/k", "/nowhere-M0000042"} {
		for _, method := range []string{"M0000042", "PROPFIND", http.MethodPatch} {
			d.do(method, path, "", nil)
		}
	}
	d.do(http.MethodGet, "/healthz", "", nil)
	text := d.metricsText()
	for _, bad := range []string{"M0000042", "PROPFIND", "PATCH", "nowhere"} {
		if strings.Contains(text, bad) {
			t.Errorf("a client-chosen %q became a label value", bad)
		}
	}
	for _, want := range []string{
		`idemd_requests_total{endpoint="other",outcome="method_not_allowed"`,
		`idemd_requests_total{endpoint="other",outcome="not_found"`,
		`idemd_requests_total{endpoint="GET /healthz",outcome="ok",tenant="-"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
