package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/throttler/throttler/internal/metrics"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNamesAndLabels: every collector sits on the caller's registry, with the
// throttler_ prefix and per-lane labels only.
func TestNamesAndLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.Dispatched.WithLabelValues("demo", "done").Add(3)
	m.EffectiveRate.WithLabelValues("demo").Set(20)
	var missed uint64 = 7
	m.WatchMissed("demo", func() uint64 { return missed })
	// A second service in the same process gets its own registry: no clash.
	metrics.New(prometheus.NewRegistry())

	if got := testutil.ToFloat64(m.Dispatched.WithLabelValues("demo", "done")); got != 3 {
		t.Fatalf("dispatches %v", got)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		seen[f.GetName()] = true
		if !strings.HasPrefix(f.GetName(), "throttler_") {
			t.Errorf("metric %s lacks the throttler_ prefix", f.GetName())
		}
		for _, mm := range f.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "key" {
					t.Errorf("metric %s has a per-key label", f.GetName())
				}
			}
		}
	}
	for _, want := range []string{"throttler_dispatches_total", "throttler_lane_effective_rate", "throttler_slots_missed_total"} {
		if !seen[want] {
			t.Errorf("%s not gathered", want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "throttler_slots_missed_total"); err != nil || n != 1 {
		t.Fatalf("slots missed: %d %v", n, err)
	}
}
