package metrics

import (
	"regexp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// RuntimeCollectors are the Go runtime's and the process's collectors, as
// the service registers them. Besides the default Go metrics they export
// go_gc_heap_allocs_bytes_total (bytes allocated on the heap), which
// stands in for go_memstats_alloc_bytes_total: Exposed leaves that one out.
func RuntimeCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/allocs:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
}

// clashing are families whose OpenMetrics form shares its name with
// another family: in OpenMetrics a counter's family drops _total, so the
// Go collector's counter go_memstats_alloc_bytes_total would be a second
// family go_memstats_alloc_bytes beside the gauge of that name (promtool
// check metrics refuses the exposition: "second HELP line").
var clashing = []string{"go_memstats_alloc_bytes_total"}

// Exposed is what /metrics serves of g: everything but the clashing
// families.
func Exposed(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := g.Gather()
		return slices.DeleteFunc(fams, func(f *dto.MetricFamily) bool { return slices.Contains(clashing, f.GetName()) }), err
	})
}
