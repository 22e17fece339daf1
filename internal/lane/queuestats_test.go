package lane

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// countingReader counts the JetStream reads of WatchQueues; fail makes
// every read fail.
type countingReader struct {
	calls atomic.Int64
	fail  atomic.Bool
}

var errAway = errors.New("jetstream away")

func (c *countingReader) Depth(context.Context, string) (queue.Depth, error) {
	c.calls.Add(1)
	if c.fail.Load() {
		return queue.Depth{}, errAway
	}
	return queue.Depth{Stored: 3, Oldest: time.Now().Add(-time.Minute)}, nil
}

func (c *countingReader) RetriesByLane(context.Context) (map[string]uint64, error) {
	c.calls.Add(1)
	if c.fail.Load() {
		return nil, errAway
	}
	return map[string]uint64{"a": 1}, nil
}

func (c *countingReader) DeadByLane(context.Context) (map[string]uint64, error) {
	c.calls.Add(1)
	return map[string]uint64{"b": 2}, nil
}

// gauge reads one gauge of reg: name{lane="…"}.
func gauge(t *testing.T, reg *prometheus.Registry, name, lane string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name || f.GetType() != dto.MetricType_GAUGE {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "lane" && l.GetValue() == lane {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no gauge %s{lane=%q}", name, lane)
	return 0
}

// TestQueueGaugesCostNoCallPerScrape: the JetStream reads happen in the
// background, lanes + 2 per interval; scraping often adds none. A read that
// fails keeps the last values.
func TestQueueGaugesCostNoCallPerScrape(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	lanes := []string{"a", "b", "c"}
	for _, l := range lanes {
		m.InitLane(l)
	}
	r := &countingReader{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); WatchQueues(ctx, r, lanes, m, time.Hour, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 5*time.Second, "one refresh", func() bool { return r.calls.Load() == int64(len(lanes)+2) })
	testenv.Eventually(t, 5*time.Second, "the gauges", func() bool {
		return gauge(t, reg, "throttler_lane_backlog", "c") == 3 && gauge(t, reg, "throttler_lane_dead_letters", "b") == 2
	})
	for name, want := range map[string]float64{"throttler_lane_retrying/a": 1, "throttler_lane_retrying/b": 0, "throttler_lane_dead_letters/a": 0} {
		n, l, _ := strings.Cut(name, "/")
		if got := gauge(t, reg, n, l); got != want {
			t.Errorf("%s{lane=%q} = %v, want %v", n, l, got, want)
		}
	}
	if age := gauge(t, reg, "throttler_lane_oldest_job_age_seconds", "a"); age < 59 || age > 70 {
		t.Fatalf("oldest job age %v, want about 60", age)
	}
	for range 100 {
		reg.Gather()
	}
	if n := r.calls.Load(); n != int64(len(lanes)+2) {
		t.Fatalf("%d reads after 100 scrapes, want still %d", n, len(lanes)+2)
	}
	// A read that fails keeps the last values.
	r.fail.Store(true)
	if err := readQueues(ctx, r, lanes, m, time.Second); !errors.Is(err, errAway) {
		t.Fatalf("readQueues = %v, want the read's error", err)
	}
	if got := gauge(t, reg, "throttler_lane_backlog", "c"); got != 3 {
		t.Fatalf("backlog %v after a failed read, want the last value 3", got)
	}
}
