package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
)

// openMigration opens the store --migrate-from names, with the layout its own daemons
// agreed, and serves through a Migrator from --store.
func (m *Main) openMigration() error {
	saved, layout, hashes := m.Store, m.RecordLayout, m.HashRecords
	m.Store, m.RecordLayout, m.HashRecords, m.clientName = m.MigrateFrom, "auto", false, redisstore.MigratingClientName
	old, err := m.openStore()
	m.Store, m.RecordLayout, m.HashRecords, m.clientName = saved, layout, hashes, ""
	if err != nil {
		return fmt.Errorf("--migrate-from: %w", err)
	}
	mig, err := engine.NewMigrator(m.store, old)
	if err != nil {
		_ = old.Close()
		return fmt.Errorf("--migrate-from: %w", err)
	}
	m.store, m.migrator = mig, mig
	m.Logger.Info("moving records live", "from", redactURL(m.MigrateFrom), "to", redactURL(m.Store))
	return nil
}

// served is the store the daemon serves from: --store, also while it moves records
// out of another one.
func (m *Main) served() engine.Store {
	if m.migrator != nil {
		return m.migrator.Next()
	}
	return m.store
}

// migration is where this daemon's copier stands.
var migration struct {
	sync.Mutex
	p engine.MoveProgress
}

// copyOut runs the copier until it finds nothing left to hand over, passes again
// after a failure, and logs its progress every few seconds.
func (m *Main) copyOut(ctx context.Context) {
	last := time.Now()
	report := func(p engine.MoveProgress) {
		migration.Lock()
		migration.p = p
		migration.Unlock()
		if time.Since(last) > 2*time.Second || p.Done {
			last = time.Now()
			now := time.Now()
			m.Logger.Info("moving records", "handed_over", p.Moved, "left", p.Left, "daemons_on_the_old_store_alone", p.AloneDaemons, "moved_before", p.Passed, "failed", p.Failed,
				"per_second", fmt.Sprintf("%.0f", p.Rate(now)), "to_go", p.ToGo(now).Round(time.Second), "done", p.Done,
				"waiting_for", strings.Join(p.Waiting, "; "))
		}
	}
	for ctx.Err() == nil {
		p, err := m.migrator.CopyAll(ctx, report)
		if err == nil && p.Done {
			m.Logger.Info("the old store holds only markers: retire it once every daemon serves from the new store alone",
				"from", redactURL(m.MigrateFrom))
			return
		}
		if errors.Is(err, context.Canceled) {
			return
		}
		m.Logger.Warn("the copier stopped; it passes again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// migrationStatus is the copier's progress for the console's store view.
func (m *Main) migrationStatus() server.Migration {
	migration.Lock()
	p := migration.p
	migration.Unlock()
	handed, sealed := m.migrator.Counts()
	now := time.Now()
	out := server.Migration{From: redactURL(m.MigrateFrom), HandedOver: p.Moved, Left: p.Left, ByCalls: handed + sealed - p.Moved,
		Failed: p.Failed, Done: p.Done, AloneDaemons: p.AloneDaemons, Waiting: p.Waiting}
	if !p.Started.IsZero() {
		out.PerSecond, out.ToGoS = p.Rate(now), p.ToGo(now).Seconds()
	}
	return out
}

// migrationMetrics exports the copier's progress.
func (m *Main) migrationMetrics() prometheus.Collector {
	return migrationCollector{m}
}

type migrationCollector struct{ m *Main }

var (
	migMoved = prometheus.NewDesc("idemd_migration_keys_handed_over", "Keys this daemon's copier handed over from the old store in the live move.", nil, nil)
	migDone  = prometheus.NewDesc("idemd_migration_done", "1 once this daemon's copier found only markers in the old store, and no daemon serving it alone.", nil, nil)
	migAlone = prometheus.NewDesc("idemd_migration_alone_daemons", "Daemons serving the old store alone, and connections to it that may be daemons that do not know markers, at the copier's last look.", nil, nil)
	migLeft  = prometheus.NewDesc("idemd_migration_keys_left", "Keys the copier's pass still has to hand over from the old store.", nil, nil)
	migCalls = prometheus.NewDesc("idemd_migration_keys_handed_over_by_calls", "Keys this daemon handed over from the old store, by calls and the copier, and found sealed.", []string{"how"}, nil)
)

func (c migrationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- migMoved
	ch <- migDone
	ch <- migLeft
	ch <- migAlone
	ch <- migCalls
}

func (c migrationCollector) Collect(ch chan<- prometheus.Metric) {
	migration.Lock()
	p := migration.p
	migration.Unlock()
	done := 0.0
	if p.Done {
		done = 1
	}
	ch <- prometheus.MustNewConstMetric(migMoved, prometheus.GaugeValue, float64(p.Moved))
	ch <- prometheus.MustNewConstMetric(migDone, prometheus.GaugeValue, done)
	ch <- prometheus.MustNewConstMetric(migLeft, prometheus.GaugeValue, float64(p.Left))
	ch <- prometheus.MustNewConstMetric(migAlone, prometheus.GaugeValue, float64(p.AloneDaemons))
	handed, sealed := c.m.migrator.Counts()
	ch <- prometheus.MustNewConstMetric(migCalls, prometheus.CounterValue, float64(handed), "imported")
	ch <- prometheus.MustNewConstMetric(migCalls, prometheus.CounterValue, float64(sealed), "sealed")
}
