package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCallersInit: Init makes every lane × plan × layer series of both
// caller counters at 0, the unknown lane and the "none" plan included; the
// utilization gauges show what Watch reads.
func TestCallersInit(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Callers.Init([]string{"demo"}, []string{"free"})
	m.Callers.Watch(func() (map[string]float64, map[string]float64) {
		return map[string]float64{"free": 0.25}, map[string]float64{"demo": 0.5}
	})
	got := series(t, reg)
	for _, lane := range []string{"demo", UnknownLane} {
		for _, plan := range []string{"free", NoPlan} {
			for _, layer := range []string{LayerIP, LayerPlan} {
				for _, name := range []string{"throttler_caller_rejections_total", "throttler_caller_observed_rejections_total"} {
					k := name + "{lane=" + lane + ",layer=" + layer + ",plan=" + plan + "}"
					if v, ok := got[k]; !ok || v != 0 {
						t.Errorf("%s = %v, %v; want 0", k, v, ok)
					}
				}
			}
		}
	}
	if got["throttler_caller_plan_utilization{plan=free}"] != 0.25 || got["throttler_caller_lane_utilization{lane=demo}"] != 0.5 {
		t.Errorf("utilization gauges: %v", got)
	}
	if _, ok := got["throttler_caller_quota_fallbacks_total{}"]; !ok {
		t.Errorf("no fallbacks counter")
	}
}
