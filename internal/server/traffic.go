package server

import (
	"math"
	"sync"
	"time"
)

// claimEndpoint is the endpoint label of a claim, whose answers traffic counts.
const claimEndpoint = "POST /v1/claim"

// traffic keeps, in process, the last few minutes of each tenant's claims: how many
// ended in each outcome and how long they took, in one bucket per second. It feeds the
// console's charts, which must work without a Prometheus to ask. Its memory is bounded
// whatever the traffic: a fixed ring of buckets per tenant, and at most trafficTenants
// tenants, which come from the auth file anyway; requests without a tenant are never
// counted.
type traffic struct {
	mu      sync.RWMutex
	tenants map[string]*tenantTraffic
}

// The traffic's bounds. A tenant's ring takes trafficWindow*(8+4*(claimOutcomes+
// latencyBuckets)) bytes, about 33 KiB, made at its first claim.
const (
	trafficWindow  = 180 // buckets of one second each: three minutes
	trafficTenants = 256
)

// claimOutcome is what the console charts of a claim: the outcomes a caller branches
// on, and the rest together.
type claimOutcome int

const (
	claimAcquired claimOutcome = iota
	// claimReplayed is a claim answered with a stored result, completed or failed.
	claimReplayed
	claimInProgress
	claimFingerprintMismatch
	// claimOther is every other answer: invalid requests, rate limits, the store
	// unavailable, a caller that hung up.
	claimOther
	claimOutcomes
)

// claimOutcomeNames are the outcomes' names in the console's JSON, in order.
var claimOutcomeNames = [claimOutcomes]string{"acquired", "replayed", "in_progress", "fingerprint_mismatch", "other"}

// classify maps a claim's outcome label (a success's outcome or a problem's code) to
// what the console charts.
func classify(outcome string) claimOutcome {
	switch outcome {
	case "acquired":
		return claimAcquired
	case "completed", "failed":
		return claimReplayed
	case string(codeInProgress):
		return claimInProgress
	case string(codeFingerprintMismatch):
		return claimFingerprintMismatch
	}
	return claimOther
}

// Latencies are counted in buckets whose bounds grow by a factor of √2 from 100 µs, so
// that a percentile read from them is within that factor of the true one; the last
// bucket holds everything past about 52 s (a claim that waited).
const latencyBuckets = 40

var latencyBounds = func() (b [latencyBuckets - 1]time.Duration) {
	for i := range b {
		b[i] = time.Duration(float64(100*time.Microsecond) * math.Pow(math.Sqrt2, float64(i)))
	}
	return b
}()

func latencyBucket(d time.Duration) int {
	// The bounds are few and the common latencies sit low, so a scan from the bottom
	// ends in a handful of steps.
	for i, bound := range latencyBounds {
		if d <= bound {
			return i
		}
	}
	return latencyBuckets - 1
}

// trafficBucket is one second of a tenant's claims.
type trafficBucket struct {
	// second is the Unix second the bucket holds; a bucket whose second has passed out
	// of the window is stale, and is cleared by the first claim that lands on it again.
	second  int64
	counts  [claimOutcomes]uint32
	latency [latencyBuckets]uint32
}

type tenantTraffic struct {
	mu      sync.Mutex
	buckets [trafficWindow]trafficBucket
}

func newTraffic() *traffic { return &traffic{tenants: make(map[string]*tenantTraffic)} }

// ring returns the tenant's ring, making it at the tenant's first claim, or nil once
// trafficTenants tenants are tracked.
func (t *traffic) ring(tenant string) *tenantTraffic {
	t.mu.RLock()
	r := t.tenants[tenant]
	t.mu.RUnlock()
	if r != nil {
		return r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r = t.tenants[tenant]; r == nil && len(t.tenants) < trafficTenants {
		r = &tenantTraffic{}
		t.tenants[tenant] = r
	}
	return r
}

// record counts a claim of tenant that ended at end with outcome, after took; a
// negative took counts the claim without a latency (an item of a batch, whose own
// time is not measured apart from the batch's). It is on every claim's path, so it
// takes one map read under a shared lock and one short lock of the tenant's own.
func (t *traffic) record(tenant, outcome string, end time.Time, took time.Duration) {
	if t == nil || tenant == noTenant {
		return
	}
	r := t.ring(tenant)
	if r == nil {
		return
	}
	second := end.Unix()
	r.mu.Lock()
	b := &r.buckets[second%trafficWindow]
	if b.second != second {
		*b = trafficBucket{second: second}
	}
	b.counts[classify(outcome)]++
	if took >= 0 {
		b.latency[latencyBucket(took)]++
	}
	r.mu.Unlock()
}

// trafficSeries is what the console charts: one value per second, oldest first, for
// the trafficWindow seconds that ended before now. The latencies are in milliseconds,
// nil for a second without a measured claim.
type trafficSeries struct {
	Tenant string `json:"tenant"`
	// Tracked is false when the tenant's claims are not counted: more tenants than
	// the console tracks made claims since the daemon started.
	Tracked     bool                `json:"tracked"`
	Start       time.Time           `json:"start"`
	StepSeconds int                 `json:"step_seconds"`
	Claims      map[string][]uint32 `json:"claims"`
	Totals      map[string]uint64   `json:"totals"`
	P50Ms       []*float64          `json:"p50_ms"`
	P99Ms       []*float64          `json:"p99_ms"`
}

// series reads a tenant's last trafficWindow whole seconds before now.
func (t *traffic) series(tenant string, now time.Time) trafficSeries {
	last := now.Unix() - 1
	first := last - trafficWindow + 1
	out := trafficSeries{Tenant: tenant, Tracked: true, Start: time.Unix(first, 0).UTC(), StepSeconds: 1,
		Claims: make(map[string][]uint32, claimOutcomes), Totals: make(map[string]uint64, claimOutcomes),
		P50Ms: make([]*float64, trafficWindow), P99Ms: make([]*float64, trafficWindow)}
	for _, name := range claimOutcomeNames {
		out.Claims[name] = make([]uint32, trafficWindow)
		out.Totals[name] = 0
	}
	t.mu.RLock()
	r := t.tenants[tenant]
	full := len(t.tenants) >= trafficTenants
	t.mu.RUnlock()
	if r == nil {
		// A tenant not yet seen is tracked from its first claim, unless the table is full.
		out.Tracked = !full
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range trafficWindow {
		second := first + int64(i)
		b := &r.buckets[second%trafficWindow]
		if b.second != second {
			continue
		}
		for o, name := range claimOutcomeNames {
			out.Claims[name][i] = b.counts[o]
			out.Totals[name] += uint64(b.counts[o])
		}
		out.P50Ms[i] = quantileMs(&b.latency, 0.50)
		out.P99Ms[i] = quantileMs(&b.latency, 0.99)
	}
	return out
}

// quantileMs reads quantile q of a second's latencies as the upper bound of the bucket
// that holds it, in milliseconds: never below the true value, and within a factor of √2
// of it. The open last bucket reads as its lower bound.
func quantileMs(h *[latencyBuckets]uint32, q float64) *float64 {
	var total uint64
	for _, n := range h {
		total += uint64(n)
	}
	if total == 0 {
		return nil
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	i := 0
	for ; i < latencyBuckets-1; i++ {
		if seen += uint64(h[i]); seen >= rank {
			break
		}
	}
	ms := float64(latencyBounds[min(i, len(latencyBounds)-1)]) / float64(time.Millisecond)
	return &ms
}
