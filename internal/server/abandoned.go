package server

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/engine"
)

// abandonedCollector exports, per tenant, how many keys are abandoned (pending under a
// lease that ran out) and how long the oldest has been, for the alert on work that
// nobody finishes. It counts through the feed when scraped, at most once per
// abandonedEvery and up to abandonedCap keys a tenant, so that a scrape costs a bounded
// read of the pending keys whatever the store holds; between counts it exports the last
// one. The label is the tenant, a set the auth file bounds.
type abandonedCollector struct {
	engine  Engine
	tenants func() []string
	count   *prometheus.Desc
	oldest  *prometheus.Desc

	mu      sync.Mutex
	counted time.Time
	last    []prometheus.Metric
	// byTenant is the last count by tenant, which the console's overview shows.
	byTenant map[string]keyCounts
}

// keyCounts is what the console shows of a tenant's unfinished keys: its abandoned
// keys and its pending keys (abandoned or under a live lease), each counted up to a cap.
type keyCounts struct {
	abandoned int
	pending   int
	// pendingCapped says that pending stopped at pendingCap: there are at least as many.
	pendingCapped bool
}

const (
	abandonedEvery   = 30 * time.Second
	abandonedCap     = 10000
	abandonedTimeout = 5 * time.Second
	// pendingCap bounds the pending keys counted for the console, with the abandoned
	// keys: a count reads at most this many through the feed, whose lookups cost a
	// read each, so that the overview stays cheap whatever a tenant has in flight.
	pendingCap = 1000
)

// pendingBefore is a lease expiry later than any lease runs out: the feed asked for
// keys whose lease ran out by then answers every pending key.
var pendingBefore = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func newAbandonedCollector(eng Engine, tenants func() []string) *abandonedCollector {
	return &abandonedCollector{
		engine:  eng,
		tenants: tenants,
		count: prometheus.NewDesc("idemd_abandoned_keys",
			"Pending keys whose lease ran out and that nobody has claimed since, by tenant; counted when scraped, at most every 30 s, up to 10000.",
			[]string{"tenant"}, nil),
		oldest: prometheus.NewDesc("idemd_abandoned_oldest_seconds",
			"How long ago the lease of the longest-abandoned key ran out, by tenant; 0 when none is abandoned.",
			[]string{"tenant"}, nil),
	}
}

func (c *abandonedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.count
	ch <- c.oldest
}

func (c *abandonedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refresh()
	for _, m := range c.last {
		ch <- m
	}
}

// refresh counts again once the last count is abandonedEvery old; c.mu is held.
func (c *abandonedCollector) refresh() {
	if now := time.Now(); now.Sub(c.counted) >= abandonedEvery {
		if fresh, byTenant, ok := c.measure(now); ok {
			c.last, c.byTenant, c.counted = fresh, byTenant, now
		}
	}
}

// counts returns the abandoned and pending keys of each tenant, as last counted (at
// most abandonedEvery ago), and when they were counted.
func (c *abandonedCollector) counts() (map[string]keyCounts, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refresh()
	return c.byTenant, c.counted
}

// measure counts every tenant's abandoned keys; a tenant the store could not answer
// for fails the whole count, which keeps the previous one rather than report zero.
func (c *abandonedCollector) measure(now time.Time) ([]prometheus.Metric, map[string]keyCounts, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonedTimeout)
	defer cancel()
	tenants := c.tenants()
	slices.Sort(tenants)
	var out []prometheus.Metric
	byTenant := make(map[string]keyCounts, len(tenants))
	for _, tenant := range tenants {
		n, oldest, err := c.countTenant(ctx, tenant, now, abandonedCap)
		if err != nil {
			return nil, nil, false
		}
		pending, _, err := c.countTenant(ctx, tenant, pendingBefore, pendingCap)
		if err != nil {
			return nil, nil, false
		}
		byTenant[tenant] = keyCounts{abandoned: n, pending: pending, pendingCapped: pending >= pendingCap}
		out = append(out,
			prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(n), tenant),
			prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, oldest.Seconds(), tenant))
	}
	return out, byTenant, true
}

// countTenant counts, up to limit, the tenant's pending keys whose lease ran out by
// before, and how long ago the earliest ran out.
func (c *abandonedCollector) countTenant(ctx context.Context, tenant string, before time.Time, limit int) (int, time.Duration, error) {
	q := engine.AbandonedQuery{Tenant: tenant, Before: before, Limit: min(limit, engine.MaxAbandonedLimit)}
	n, oldest := 0, time.Duration(0)
	// A page may hold no key and still go on (a store bounds what one page reads), so
	// the pages are bounded too.
	for pages := 0; n < limit && pages < 100; pages++ {
		page, err := c.engine.Abandoned(ctx, q)
		if err != nil {
			return 0, 0, err
		}
		for _, k := range page.Keys {
			oldest = max(oldest, before.Sub(k.LeaseExpiredAt))
		}
		n += len(page.Keys)
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	return min(n, limit), oldest, nil
}
