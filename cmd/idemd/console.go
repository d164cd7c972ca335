package main

import (
	"context"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
)

// console is what --console hands the server: whether to serve the console, and what
// its store view shows of the store Open opened.
func (m *Main) console() server.Console {
	if !m.Console {
		return server.Console{}
	}
	info := server.StoreInfo{Kind: storeKind(m.Store), Layout: m.RecordLayout, Location: redactURL(m.Store)}
	if m.HashRecords {
		info.Layout = "hashes"
	}
	if info.Kind == "embedded" {
		info.Layout, info.Location = "bbolt", strings.TrimPrefix(m.Store, "bolt://")
	}
	if c, ok := m.served().(prometheus.Collector); ok {
		info.Stats = c
	}
	if rs, ok := m.served().(*redisstore.Store); ok {
		info.AgreedLayout = func(ctx context.Context) (string, string, error) {
			a, err := rs.AgreeLayout(ctx)
			return string(a.Layout), a.Reason, err
		}
		info.Topology = func(ctx context.Context) ([]server.StoreNode, error) {
			nodes, err := rs.Topology(ctx)
			out := make([]server.StoreNode, 0, len(nodes))
			for _, n := range nodes {
				sn := server.StoreNode{Address: n.Address, RoundTrip: n.RoundTrip, Err: n.Err}
				for _, r := range n.Replicas {
					sn.Replicas = append(sn.Replicas, server.StoreReplica(r))
				}
				out = append(out, sn)
			}
			return out, err
		}
	}
	if m.migrator != nil {
		info.Migration = m.migrationStatus
	}
	return server.Console{Enabled: true, Store: info}
}

// storeKind names the kind of store a store URL opens, as the console shows it.
func storeKind(url string) string {
	scheme, _, _ := strings.Cut(url, "://")
	switch {
	case scheme == "bolt":
		return "embedded"
	case strings.HasSuffix(scheme, "+sentinel"):
		return "sentinel"
	case strings.HasSuffix(scheme, "+cluster"):
		return "cluster"
	}
	return "redis"
}
