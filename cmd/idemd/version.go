package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	release "github.com/idemd/idemd/internal/version"
)

// version and commit may be stamped by a build, which overrides what the tree says:
//
//	go build -ldflags "-X main.version=0.5.1-rc.1 -X main.commit=$(git rev-parse HEAD)" ./cmd/idemd
//
// Left empty, the version is the release the tree is (internal/version), and the commit
// is the VCS revision Go records for a build made in a git checkout.
var version, commit string

// build is what `idemd --version` prints and idemd_build_info exports.
type build struct {
	Version, Commit, GoVersion string
}

func buildOf() build {
	b := build{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if b.Version == "" {
		b.Version = release.Release
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b.orUnknown()
	}
	if b.Commit == "" {
		var modified bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if b.Commit != "" && modified {
			b.Commit += "-dirty"
		}
	}
	return b.orUnknown()
}

func (b build) orUnknown() build {
	if b.Version == "" {
		b.Version = "unknown"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func (b build) String() string {
	return fmt.Sprintf("idemd %s (contract %s, commit %s, %s)", b.Version, release.Contract, b.Commit, b.GoVersion)
}

// buildInfoGauge is idemd_build_info: always 1, with the build in its labels, so that a
// dashboard can show which versions run and a query can join on them.
func buildInfoGauge() prometheus.Collector {
	b := buildOf()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "idemd_build_info",
		Help:        "Always 1; the labels say which build of idemd runs.",
		ConstLabels: prometheus.Labels{"version": b.Version, "contract": release.Contract, "commit": b.Commit, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
