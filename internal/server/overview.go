package server

import (
	"context"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemd/idemd/internal/auth"
)

// overviewTenant is one tenant's line of the console's overview: what the store keeps
// of it against its quota (0 for none), and its claims in this daemon lately.
type overviewTenant struct {
	Tenant         string  `json:"tenant"`
	Records        *int64  `json:"records"`
	StoredBytes    *int64  `json:"stored_bytes"`
	MaxRecords     int64   `json:"max_records,omitempty"`
	MaxStoredBytes int64   `json:"max_stored_bytes,omitempty"`
	QuotaPercent   float64 `json:"quota_percent,omitempty"`
	// ClaimsPerSecond and RefusedPerSecond are this daemon's claims of the tenant over
	// the traffic window, all and those answered by something else than a lease, a
	// replay, in progress or a mismatch (a rate limit, a quota, the store unavailable).
	ClaimsPerSecond  float64 `json:"claims_per_second"`
	RefusedPerSecond float64 `json:"refused_per_second"`
	UsageError       string  `json:"usage_error,omitempty"`
	// Abandoned is the tenant's abandoned keys as last counted (at most 30 s ago, up
	// to 10000), nil when they could not be counted.
	Abandoned *int `json:"abandoned"`
	// Pending is the tenant's pending keys, abandoned or under a live lease, counted
	// with the abandoned ones up to 1000; PendingCapped says the count stopped there,
	// so that there are at least as many. Pending is nil when they could not be counted.
	Pending       *int `json:"pending"`
	PendingCapped bool `json:"pending_capped"`
}

type overview struct {
	Tenants []overviewTenant `json:"tenants"`
	// StoreFill is how full the store is, nil without a limit; Guard is --store-guard.
	StoreFill *float64 `json:"store_fill"`
	// Daemon names the daemon serving the page: the claims are its own, while usage
	// is the store's, the same through every daemon sharing it.
	Daemon string `json:"daemon"`
	Scope  string `json:"scope"`
}

// overviewTimeout bounds the usage reads of one overview.
const overviewTimeout = 5 * time.Second

// consoleOverview answers the page on-call opens first: each tenant the token may see
// (its own, or every one with the platform scope and use), its usage of the store
// against its quota, and its claims lately.
func (s *Server) consoleOverview(c echo.Context) error {
	if err := onlyParams(c); err != nil {
		return err
	}
	p := principalOf(c)
	tenants := []string{p.Tenant.Name}
	if p.Can(auth.ScopePlatform) {
		tenants = s.console.tenants()
		slices.Sort(tenants)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), overviewTimeout)
	defer cancel()
	host, _ := os.Hostname()
	out := overview{Tenants: []overviewTenant{}, Daemon: host,
		Scope: "usage and quotas are the store's, shared by every daemon; claims per second are this daemon's only"}
	usage, counts := s.engine.(usageEngine)
	abandoned, _ := s.abandoned.counts()
	now := time.Now()
	for _, tenant := range tenants {
		if p.AuthorizeIn(tenant, auth.ScopeUse) != nil {
			continue
		}
		line := overviewTenant{Tenant: tenant}
		if s.console.limits != nil {
			if l, ok := s.console.limits(tenant); ok {
				line.MaxRecords, line.MaxStoredBytes = l.MaxRecords, l.MaxStoredBytes
			}
		}
		if counts {
			if u, err := usage.Usage(ctx, tenant); err == nil {
				line.Records, line.StoredBytes = &u.Records, &u.Bytes
				if line.MaxRecords > 0 {
					line.QuotaPercent = max(line.QuotaPercent, 100*float64(u.Records)/float64(line.MaxRecords))
				}
				if line.MaxStoredBytes > 0 {
					line.QuotaPercent = max(line.QuotaPercent, 100*float64(u.Bytes)/float64(line.MaxStoredBytes))
				}
			} else {
				line.UsageError = toProblem(err).detail
			}
		}
		if n, ok := abandoned[tenant]; ok {
			line.Abandoned, line.Pending, line.PendingCapped = &n.abandoned, &n.pending, n.pendingCapped
		}
		t := s.traffic.series(tenant, now)
		window := float64(trafficWindow * t.StepSeconds)
		var all uint64
		for _, n := range t.Totals {
			all += n
		}
		line.ClaimsPerSecond = float64(all) / window
		line.RefusedPerSecond = float64(t.Totals[claimOutcomeNames[claimOther]]) / window
		out.Tenants = append(out.Tenants, line)
	}
	if counts {
		if f, err := usage.StoreFill(ctx); err == nil && f.Limit > 0 {
			r := f.Ratio()
			out.StoreFill = &r
		}
	}
	return s.reply(c, answer{http.StatusOK, "ok", out})
}
