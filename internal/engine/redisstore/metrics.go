package redisstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	slotsDesc = prometheus.NewDesc("idemd_redis_pipeline_slots",
		"Pipelines that may be in flight at once to a Redis master: --redis-pipelines, more over a slow link.",
		[]string{"master"}, nil)
	roundTripDesc = prometheus.NewDesc("idemd_redis_round_trip_seconds",
		"The shortest round trip of a pipeline to a Redis master lately, WAIT for replicas included.",
		[]string{"master"}, nil)
	queuedDesc = prometheus.NewDesc("idemd_redis_queued_calls",
		"Calls waiting for a pipeline to a Redis master.", []string{"master"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Store) Describe(ch chan<- *prometheus.Desc) {
	ch <- slotsDesc
	ch <- roundTripDesc
	ch <- queuedDesc
}

// Collect implements prometheus.Collector: one series each per master that has a lane.
func (s *Store) Collect(ch chan<- prometheus.Metric) {
	for _, l := range s.pipe.laneStats() {
		ch <- prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(l.slots), l.master)
		if l.roundTrip > 0 {
			ch <- prometheus.MustNewConstMetric(roundTripDesc, prometheus.GaugeValue, l.roundTrip.Seconds(), l.master)
		}
		ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(l.queued), l.master)
	}
}

// laneStat is what the metrics show of one lane.
type laneStat struct {
	master    string
	slots     int
	roundTrip time.Duration
	queued    int64
}

func (p *pipeliner) laneStats() []laneStat {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]laneStat, 0, len(p.lanes))
	for addr, l := range p.lanes {
		l.mu.Lock()
		out = append(out, laneStat{master: addr, slots: l.slots, roundTrip: l.floor(), queued: l.pending.Load()})
		l.mu.Unlock()
	}
	return out
}
