package metrics

import "github.com/prometheus/client_golang/prometheus"

// Build names the running binary.
type Build struct {
	// Version is the release (main.version from the build, else the
	// module version).
	Version string
	// Revision is the VCS revision it was built from, with "-modified"
	// when the tree had uncommitted changes; "unknown" when nobody said.
	Revision string
	// GoVersion is the Go toolchain that built it (runtime.Version()).
	GoVersion string
}

// NewBuildInfo returns throttler_build_info: a gauge at 1 whose labels
// name the build (version, revision, goversion), to join on or to count
// the versions running in a fleet.
func NewBuildInfo(b Build) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "throttler_build_info",
		Help:        "1, with the build's version, VCS revision and Go version as labels.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
