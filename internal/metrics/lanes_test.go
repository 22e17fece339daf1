package metrics

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/throttler/throttler/internal/clock"
)

// series gathers reg and returns every series as name{labels} → value
// (histograms by their sample count).
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := f.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestInitLaneMakesEverySeries: after InitLane, every vector of Metrics
// has the lane's series, at 0, and the counters every label combination
// the code uses; so the first event on a lane is an increase from 0.
func TestInitLaneMakesEverySeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.InitLane("demo")
	got := series(t, reg)

	// Every vector field: the lane's own gauges (set by the lane when it
	// starts, with their true values) are the only ones InitLane leaves.
	// Callers' series exist when caller quotas are on (Callers.Init, tested
	// in TestCallersInit). PullRepliesRefused's series are made by
	// pull-mode lanes only, with the reasons package dispatch names.
	// RecordWrites' by lanes that keep records (TestRecordWritesInit).
	setByLane := map[string]bool{"PacerUp": true, "EffectiveRate": true, "Callers": true, "PullRepliesRefused": true, "RecordWrites": true}
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if !f.IsExported() || setByLane[f.Name] {
			continue
		}
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		if testutil.CollectAndCount(c) == 0 {
			t.Errorf("Metrics.%s has no series after InitLane", f.Name)
		}
	}

	for _, want := range []string{
		"throttler_dispatches_total{lane=demo,outcome=done}",
		"throttler_dispatches_total{lane=demo,outcome=retry}",
		"throttler_dispatches_total{lane=demo,outcome=dead}",
		"throttler_jobs_dead_lettered_total{lane=demo}",
		"throttler_lane_pauses_total{lane=demo}",
		"throttler_jobs_submitted_total{lane=demo,source=nats,state=queued}",
		"throttler_jobs_submitted_total{lane=demo,source=http,state=duplicate}",
		"throttler_jobs_rejected_total{lane=demo,reason=backlog_full}",
		"throttler_jobs_rejected_total{lane=_unknown,reason=unknown_lane}",
		"throttler_pacer_calls_total{lane=demo,op=reserve}",
		"throttler_job_queue_wait_seconds{lane=demo}",
		"throttler_job_end_to_end_seconds{lane=demo}",
		"throttler_lane_backlog{lane=demo}",
		"throttler_lane_oldest_job_age_seconds{lane=demo}",
		"throttler_lane_retrying{lane=demo}",
		"throttler_lane_dead_letters{lane=demo}",
	} {
		val, ok := got[want]
		if !ok {
			t.Errorf("no series %s", want)
		} else if val != 0 {
			t.Errorf("%s = %v, want 0", want, val)
		}
	}
	if n := countPrefix(got, "throttler_jobs_rejected_total{lane=demo,"); n != len(rejectReasons) {
		t.Errorf("%d rejection series of demo, want %d", n, len(rejectReasons))
	}
	// A lane not yet initialised has no series: InitLane made them.
	if n := countPrefix(got, "throttler_dispatches_total{lane=other,"); n != 0 {
		t.Errorf("lane other has %d series", n)
	}
}

func countPrefix(m map[string]float64, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// TestLaneGauges: WatchLane's state is read at every gather; SetQueue's
// values stay until the next call, and the oldest job's age is computed
// at the gather.
func TestLaneGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	c := clock.NewManual(t0)
	m.lanes.clock = c
	m.InitLane("demo")
	state := LaneState{Rate: 20, Burst: 10, Utilization: 0.5}
	m.WatchLane("demo", func() LaneState { return state })

	steps := []struct {
		name  string
		do    func()
		want  map[string]float64
		after time.Duration
	}{
		{"at start", func() {}, map[string]float64{
			"throttler_lane_configured_rate{lane=demo}": 20, "throttler_lane_burst{lane=demo}": 10,
			"throttler_lane_utilization{lane=demo}": 0.5, "throttler_lane_paused{lane=demo}": 0,
			"throttler_lane_backlog{lane=demo}": 0, "throttler_lane_oldest_job_age_seconds{lane=demo}": 0,
		}, 0},
		{"a read", func() {
			m.SetQueue("demo", LaneQueue{Backlog: 7, Oldest: t0.Add(-30 * time.Second), Retrying: 2, Dead: 3})
		}, map[string]float64{
			"throttler_lane_backlog{lane=demo}": 7, "throttler_lane_oldest_job_age_seconds{lane=demo}": 30,
			"throttler_lane_retrying{lane=demo}": 2, "throttler_lane_dead_letters{lane=demo}": 3,
		}, 0},
		{"the age grows between reads", func() {}, map[string]float64{
			"throttler_lane_oldest_job_age_seconds{lane=demo}": 35, "throttler_lane_backlog{lane=demo}": 7,
		}, 5 * time.Second},
		{"a PATCH and a pause", func() { state = LaneState{Rate: 50, Burst: 5, Utilization: 1, Paused: true} }, map[string]float64{
			"throttler_lane_configured_rate{lane=demo}": 50, "throttler_lane_burst{lane=demo}": 5,
			"throttler_lane_utilization{lane=demo}": 1, "throttler_lane_paused{lane=demo}": 1,
		}, 0},
		{"empty lane", func() { m.SetQueue("demo", LaneQueue{}) }, map[string]float64{
			"throttler_lane_backlog{lane=demo}": 0, "throttler_lane_oldest_job_age_seconds{lane=demo}": 0,
		}, 0},
		{"a stored time ahead of this clock", func() { m.SetQueue("demo", LaneQueue{Backlog: 1, Oldest: c.Now().Add(time.Second)}) }, map[string]float64{
			"throttler_lane_oldest_job_age_seconds{lane=demo}": 0,
		}, 0},
	}
	for _, s := range steps {
		c.Advance(s.after)
		s.do()
		got := series(t, reg)
		for k, want := range s.want {
			if got[k] != want {
				t.Errorf("%s: %s = %v, want %v", s.name, k, got[k], want)
			}
		}
	}
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewBuildInfo(Build{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"}))
	got := series(t, reg)
	if v, ok := got["throttler_build_info{goversion=go1.26.8,revision=abc123,version=v1.2.3}"]; !ok || v != 1 {
		t.Fatalf("build info: %v", got)
	}
}
