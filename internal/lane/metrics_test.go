package lane

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/metrics"
)

// TestStartWindow: starts per second over the last minute, at fixed times;
// a lane younger than a minute is measured over its life.
func TestStartWindow(t *testing.T) {
	t0 := time.Unix(1_900_000_000, 0) // a whole second
	var w startWindow
	w.begin(t0)
	steps := []struct {
		name      string
		at        time.Duration
		add       int
		wantN     int64
		wantSpan  time.Duration
		wantUtil  float64 // at a rate of 10/s
		tolerance float64
	}{
		{"nothing yet", 0, 0, 0, 0, 0, 0},
		{"10 starts in the first second", 500 * time.Millisecond, 10, 10, 500 * time.Millisecond, 2, 1e-9},
		{"a steady 10/s for 30 s", 30 * time.Second, 0, 10, 30 * time.Second, 10.0 / 300, 1e-9},
		{"the first starts leave the window after a minute", 60*time.Second + 500*time.Millisecond, 0, 0, 59*time.Second + 500*time.Millisecond, 0, 0},
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		for range s.add {
			w.add(now)
		}
		n, span := w.count(now)
		if n != s.wantN || span != s.wantSpan {
			t.Errorf("%s: count %d over %v, want %d over %v", s.name, n, span, s.wantN, s.wantSpan)
		}
		if u := utilization(n, span, 10); math.Abs(u-s.wantUtil) > s.tolerance {
			t.Errorf("%s: utilization %v, want %v", s.name, u, s.wantUtil)
		}
	}

	// A lane draining at its rate for a full minute: utilization 1.
	var full startWindow
	full.begin(t0)
	for ms := 0; ms < 120_000; ms += 100 { // 10/s for two minutes
		full.add(t0.Add(time.Duration(ms) * time.Millisecond))
	}
	end := t0.Add(120 * time.Second)
	n, span := full.count(end.Add(-time.Millisecond))
	if u := utilization(n, span, 10); math.Abs(u-1) > 0.02 {
		t.Fatalf("steady lane: %d starts over %v, utilization %v, want 1", n, span, u)
	}
	if u := utilization(5, 0, 10); u != 0 {
		t.Fatalf("no span: %v", u)
	}
	if u := utilization(5, time.Second, 0); u != 0 {
		t.Fatalf("no rate: %v", u)
	}
}

// TestMetricLabelsMatchTheCode: every verdict dispatch can return, and the
// NATS intake's state and source, have their series from the lane's start
// (metrics.InitLane), so their first event is an increase from 0.
func TestMetricLabelsMatchTheCode(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg).InitLane("demo")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	has := func(name string, labels map[string]string) bool {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
		series:
			for _, m := range f.GetMetric() {
				got := map[string]string{}
				for _, l := range m.GetLabel() {
					got[l.GetName()] = l.GetValue()
				}
				for k, v := range labels {
					if got[k] != v {
						continue series
					}
				}
				return true
			}
		}
		return false
	}
	for _, v := range []dispatch.Verdict{dispatch.Done, dispatch.Retry, dispatch.Dead} {
		if !has("throttler_dispatches_total", map[string]string{"lane": "demo", "outcome": v.String()}) {
			t.Errorf("no series of outcome %q after InitLane", v)
		}
	}
	if !has("throttler_jobs_submitted_total", map[string]string{"lane": "demo", "state": "queued", "source": "nats"}) {
		t.Errorf("no series of jobs queued from nats after InitLane")
	}
}
