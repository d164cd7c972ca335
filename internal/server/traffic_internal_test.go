package server

import (
	"fmt"
	"testing"
	"time"
)

func TestTrafficCountsBySecondAndForgetsTheOld(t *testing.T) {
	tr := newTraffic()
	start := time.Unix(1_000_000, 0)
	tr.record("alpha", "acquired", start, 3*time.Millisecond)
	tr.record("alpha", "completed", start.Add(time.Second), time.Millisecond)
	tr.record("alpha", "failed", start.Add(time.Second), -1)
	tr.record("alpha", "in_progress", start.Add(2*time.Second), time.Millisecond)
	tr.record("alpha", "rate_limited", start.Add(2*time.Second), time.Millisecond)
	tr.record(noTenant, "acquired", start, time.Millisecond)

	s := tr.series("alpha", start.Add(3*time.Second))
	n := len(s.Claims["acquired"])
	if n != trafficWindow || !s.Tracked {
		t.Fatalf("%d seconds, tracked %v", n, s.Tracked)
	}
	last3 := func(name string) [3]uint32 { v := s.Claims[name]; return [3]uint32{v[n-3], v[n-2], v[n-1]} }
	for name, want := range map[string][3]uint32{"acquired": {1, 0, 0}, "replayed": {0, 2, 0}, "in_progress": {0, 0, 1}, "other": {0, 0, 1}} {
		if got := last3(name); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if s.P50Ms[n-3] == nil || *s.P50Ms[n-3] < 3 || *s.P50Ms[n-3] > 3*1.42 {
		t.Errorf("p50 of a second of one 3 ms claim: %v, want within √2 above 3 ms", s.P50Ms[n-3])
	}
	if s.P50Ms[n-4] != nil {
		t.Errorf("a second without claims has a p50: %v", *s.P50Ms[n-4])
	}
	if len(tr.tenants) != 1 {
		t.Errorf("%d tenants tracked; requests without a tenant must not be", len(tr.tenants))
	}

	// A whole window after the last of them, the ring holds nothing of the first
	// seconds, even where a new claim reuses their bucket.
	later := start.Add((trafficWindow + 2) * time.Second)
	tr.record("alpha", "acquired", later, time.Millisecond)
	s = tr.series("alpha", later.Add(time.Second))
	var total uint64
	for _, v := range s.Totals {
		total += v
	}
	if total != 1 || s.Claims["acquired"][n-1] != 1 {
		t.Errorf("after a window: totals %v", s.Totals)
	}
}

func TestTrafficTracksABoundedNumberOfTenants(t *testing.T) {
	tr := newTraffic()
	now := time.Unix(2_000_000, 0)
	for i := range trafficTenants + 10 {
		tr.record(fmt.Sprintf("t%d", i), "acquired", now, time.Millisecond)
	}
	if len(tr.tenants) != trafficTenants {
		t.Fatalf("%d tenants tracked, want at most %d", len(tr.tenants), trafficTenants)
	}
	if s := tr.series(fmt.Sprintf("t%d", trafficTenants+5), now.Add(time.Second)); s.Tracked || s.Totals["acquired"] != 0 {
		t.Errorf("a tenant past the bound: tracked %v, totals %v", s.Tracked, s.Totals)
	}
	if s := tr.series("t0", now.Add(time.Second)); !s.Tracked || s.Totals["acquired"] != 1 {
		t.Errorf("the first tenant: tracked %v, totals %v", s.Tracked, s.Totals)
	}
}

func TestQuantiles(t *testing.T) {
	var h [latencyBuckets]uint32
	for range 98 {
		h[latencyBucket(time.Millisecond)]++
	}
	h[latencyBucket(time.Second)] += 2
	p50, p99 := quantileMs(&h, 0.5), quantileMs(&h, 0.99)
	if *p50 < 1 || *p50 > 1.42 || *p99 < 1000 || *p99 > 1420 {
		t.Errorf("p50 %v ms, p99 %v ms; want 1 ms and 1 s, each within √2 above", *p50, *p99)
	}
	h = [latencyBuckets]uint32{}
	h[latencyBucket(time.Hour)]++
	if got := *quantileMs(&h, 0.5); got != float64(latencyBounds[len(latencyBounds)-1])/float64(time.Millisecond) || got < 50000 {
		t.Errorf("an hour's claim reads %v ms; the open bucket, past 50 s, reads as its lower bound", got)
	}
}

// BenchmarkTrafficRecord is the cost the console adds to each claim, from many
// goroutines at once on one tenant, the worst case for its lock.
func BenchmarkTrafficRecord(b *testing.B) {
	tr := newTraffic()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.record("alpha", "acquired", time.Now(), 700*time.Microsecond)
		}
	})
}
