package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// usageEngine is an Engine that counts what tenants keep and how full its store is:
// engine.Service is one.
type usageEngine interface {
	Usage(ctx context.Context, tenant string) (engine.Usage, error)
	StoreFill(ctx context.Context) (engine.Fill, error)
}

// How often the usage metrics read the engine: a usage read costs Redis one or two
// scripts a tenant (docs/sizing.md, Quotas and the store guard).
const (
	usageEvery   = 15 * time.Second
	usageTimeout = 10 * time.Second
)

// usageCollector exports each tenant's usage of the store against its quota, and how
// full the store is. The tenant label takes the auth file's tenants only.
type usageCollector struct {
	engine  usageEngine
	tenants func() []string
	limits  func(string) (auth.Limits, bool)

	bytes, records, quotaBytes, quotaRecords, fill *prometheus.Desc

	mu      sync.Mutex
	read    time.Time
	last    []prometheus.Metric
	lastErr bool
}

func newUsageCollector(eng usageEngine, tenants func() []string, limits func(string) (auth.Limits, bool)) *usageCollector {
	return &usageCollector{
		engine: eng, tenants: tenants, limits: limits,
		bytes: prometheus.NewDesc("idemd_tenant_stored_bytes",
			"Bytes of the tenant's records as the store counts them for its quota (docs/sizing.md, Quotas), by tenant; read at most every 15 s.",
			[]string{"tenant"}, nil),
		records: prometheus.NewDesc("idemd_tenant_records",
			"The tenant's records in the store, by tenant; read at most every 15 s.", []string{"tenant"}, nil),
		quotaBytes: prometheus.NewDesc("idemd_tenant_quota_bytes",
			"The tenant's max_stored_bytes, for tenants that have one.", []string{"tenant"}, nil),
		quotaRecords: prometheus.NewDesc("idemd_tenant_quota_records",
			"The tenant's max_records, for tenants that have one.", []string{"tenant"}, nil),
		fill: prometheus.NewDesc("idemd_store_fill_ratio",
			"How full the store is: the fullest Redis master's used_memory over its maxmemory, or the embedded database over --data-max-size or its disk; absent without a limit.",
			nil, nil),
	}
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.records, c.quotaBytes, c.quotaRecords, c.fill} {
		ch <- d
	}
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.read) >= usageEvery {
		c.last, c.read = c.measure(), now
	}
	for _, m := range c.last {
		ch <- m
	}
}

// measure reads every tenant's usage and the store's fill; what cannot be read is left
// out rather than reported as nothing.
func (c *usageCollector) measure() []prometheus.Metric {
	ctx, cancel := context.WithTimeout(context.Background(), usageTimeout)
	defer cancel()
	tenants := c.tenants()
	slices.Sort(tenants)
	var out []prometheus.Metric
	for _, tenant := range tenants {
		if l, ok := c.limits(tenant); ok {
			if l.MaxStoredBytes > 0 {
				out = append(out, prometheus.MustNewConstMetric(c.quotaBytes, prometheus.GaugeValue, float64(l.MaxStoredBytes), tenant))
			}
			if l.MaxRecords > 0 {
				out = append(out, prometheus.MustNewConstMetric(c.quotaRecords, prometheus.GaugeValue, float64(l.MaxRecords), tenant))
			}
		}
		u, err := c.engine.Usage(ctx, tenant)
		if err != nil {
			continue
		}
		out = append(out,
			prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(u.Bytes), tenant),
			prometheus.MustNewConstMetric(c.records, prometheus.GaugeValue, float64(u.Records), tenant))
	}
	if f, err := c.engine.StoreFill(ctx); err == nil && f.Limit > 0 {
		out = append(out, prometheus.MustNewConstMetric(c.fill, prometheus.GaugeValue, f.Ratio()))
	}
	return out
}

// tenantUsageSeries are the metrics that tell what a tenant keeps in the store.
var tenantUsageSeries = map[string]bool{
	"idemd_tenant_stored_bytes": true, "idemd_tenant_records": true,
	"idemd_tenant_quota_bytes": true, "idemd_tenant_quota_records": true,
}

// metricsHandler serves the registry, with the tenants' usage series held to whoever
// may see them: every tenant's to a platform token, the open scrape of a server
// without an auth file or with open set; a tenant's own to its token; none otherwise.
// A token that is not known is taken as none: the scrape stays open.
func (s *Server) metricsHandler(reg *prometheus.Registry, open bool) echo.HandlerFunc {
	every := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return func(c echo.Context) error {
		seeAll := open || s.auth == nil
		var only string
		if token, ok := strings.CutPrefix(c.Request().Header.Get(echo.HeaderAuthorization), "Bearer "); ok {
			if p, err := s.auth.Authenticate(strings.TrimSpace(token)); err == nil && p != nil {
				seeAll = seeAll || p.Can(auth.ScopePlatform)
				only = p.Tenant.Name
			}
		}
		if seeAll {
			every.ServeHTTP(c.Response(), c.Request())
			return nil
		}
		gather := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
			families, err := reg.Gather()
			for _, f := range families {
				if !tenantUsageSeries[f.GetName()] {
					continue
				}
				f.Metric = slices.DeleteFunc(f.Metric, func(m *dto.Metric) bool {
					for _, l := range m.GetLabel() {
						if l.GetName() == "tenant" {
							return only == "" || l.GetValue() != only
						}
					}
					return true
				})
			}
			families = slices.DeleteFunc(families, func(f *dto.MetricFamily) bool { return len(f.Metric) == 0 })
			return families, err
		})
		promhttp.HandlerFor(gather, promhttp.HandlerOpts{}).ServeHTTP(c.Response(), c.Request())
		return nil
	}
}
