package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	idem "github.com/idemd/idemd/clients/go"
)

// tenantUsage is one tenant's line of usage: what the store keeps of it and its quota
// (0 for none).
type tenantUsage struct {
	Tenant       string  `json:"tenant"`
	Records      int64   `json:"records"`
	MaxRecords   int64   `json:"max_records,omitempty"`
	StoredBytes  int64   `json:"stored_bytes"`
	MaxStored    int64   `json:"max_stored_bytes,omitempty"`
	QuotaPercent float64 `json:"quota_percent,omitempty"`
}

type usageReport struct {
	Tenants []tenantUsage `json:"tenants"`
	// StoreFill is how full the store is, 0 to 1; absent when it has no limit.
	StoreFill *float64 `json:"store_fill,omitempty"`
}

// runUsage prints the usage of the store against its quota of each tenant the token
// may see (its own; every tenant for a platform token), and how full the store is, as
// the daemon's metrics say (docs/sizing.md, Quotas and the store
// guard): every daemon sharing a store reads the same usage.
func (a *app) runUsage(args []string) int {
	fs := a.flags("usage")
	if _, err := a.parse(fs, args, 0, "no arguments"); err != nil {
		return a.usageError(err)
	}
	transport, err := a.transport()
	if err != nil {
		return a.usageError(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(a.url, "/")+"/metrics", nil)
	if err != nil {
		return a.usageError(err)
	}
	// The daemon names a tenant's usage to that tenant's token, every tenant's to a
	// platform token, and none to an open scrape unless told to.
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return a.fail(fmt.Errorf("%w: %w", idem.ErrUnavailable, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return a.fail(fmt.Errorf("%w: /metrics answered %s", idem.ErrUnavailable, resp.Status))
	}
	byTenant := map[string]*tenantUsage{}
	var report usageReport
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 64<<10), 1<<20)
	for lines.Scan() {
		name, tenant, value, ok := metricLine(lines.Text())
		if !ok {
			continue
		}
		if name == "idemd_store_fill_ratio" {
			report.StoreFill = &value
			continue
		}
		if tenant == "" {
			continue
		}
		u := byTenant[tenant]
		if u == nil {
			u = &tenantUsage{Tenant: tenant}
			byTenant[tenant] = u
		}
		switch name {
		case "idemd_tenant_records":
			u.Records = int64(value)
		case "idemd_tenant_stored_bytes":
			u.StoredBytes = int64(value)
		case "idemd_tenant_quota_records":
			u.MaxRecords = int64(value)
		case "idemd_tenant_quota_bytes":
			u.MaxStored = int64(value)
		}
	}
	if err := lines.Err(); err != nil {
		return a.fail(fmt.Errorf("%w: %w", idem.ErrUnavailable, err))
	}
	for _, u := range byTenant {
		if u.MaxRecords > 0 {
			u.QuotaPercent = max(u.QuotaPercent, 100*float64(u.Records)/float64(u.MaxRecords))
		}
		if u.MaxStored > 0 {
			u.QuotaPercent = max(u.QuotaPercent, 100*float64(u.StoredBytes)/float64(u.MaxStored))
		}
		report.Tenants = append(report.Tenants, *u)
	}
	slices.SortFunc(report.Tenants, func(x, y tenantUsage) int { return strings.Compare(x.Tenant, y.Tenant) })
	if a.json {
		a.printJSON(report)
		return exitOK
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TENANT\tRECORDS\tMAX RECORDS\tSTORED BYTES\tMAX STORED BYTES\tOF QUOTA")
	limit := func(n int64) string {
		if n == 0 {
			return "-"
		}
		return strconv.FormatInt(n, 10)
	}
	for _, u := range report.Tenants {
		share := "-"
		if u.MaxRecords > 0 || u.MaxStored > 0 {
			share = fmt.Sprintf("%.0f%%", u.QuotaPercent)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\t%s\n", u.Tenant, u.Records, limit(u.MaxRecords), u.StoredBytes, limit(u.MaxStored), share)
	}
	_ = w.Flush()
	if report.StoreFill != nil {
		fmt.Fprintf(a.stdout, "store %.0f%% full\n", 100**report.StoreFill)
	}
	return exitOK
}

// metricLine reads a line of the text exposition format for the usage metrics: the
// metric's name, its tenant label (if any) and its value.
func metricLine(line string) (name, tenant string, value float64, ok bool) {
	if !strings.HasPrefix(line, "idemd_tenant_") && !strings.HasPrefix(line, "idemd_store_fill_ratio") {
		return "", "", 0, false
	}
	series, raw, found := strings.Cut(line, " ")
	if !found {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	if err != nil {
		return "", "", 0, false
	}
	name, labels, _ := strings.Cut(series, "{")
	if t, found := strings.CutPrefix(labels, `tenant="`); found {
		tenant, _, _ = strings.Cut(t, `"`)
	}
	return name, tenant, v, true
}
