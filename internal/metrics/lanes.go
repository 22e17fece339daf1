package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/clock"
)

// Label values of the per-lane series: the ones the code emits. InitLane
// creates every combination at 0, so that the first event on a lane shows
// in increase() and rate() (a series that first appears at 1 has no
// increase, and an alert on it cannot fire for that event). Tests in the
// packages that emit them check these lists against their code.
var (
	// submittedAs are the (state, source) pairs of Submitted: HTTP intake
	// answers admitted, queued or duplicate; a job published on NATS is
	// counted as queued when the drain first meets it, and on a keyed lane
	// as duplicate when its move into the lane finds its id there.
	submittedAs = [][2]string{{"admitted", "http"}, {"queued", "http"}, {"duplicate", "http"}, {"scheduled", "http"}, {"queued", "nats"}, {"duplicate", "nats"}}
	// rejectReasons are the reasons of Rejected (ingest's refusals).
	rejectReasons = []string{
		"shutting_down", "unknown_lane", "callback_lane", "invalid_idempotency_key", "invalid_content_type",
		"missing_throttle_key", "invalid_throttle_key", "invalid_trace_context", "invalid_schedule", "invalid_destination", "invalid_callback", "invalid_reply",
		"body_too_large", "body_inflight_full", "body_inflight_caller_full", "body_timeout", "bad_body",
		"backlog_full", "admission_error", "storage_full", "queue_unavailable",
		"invalid_wait", "too_many_waiters", "caller_waiters_full", "records_unavailable",
		"idempotency_key_conflict",
	}
	// outcomes are the verdicts of Dispatched (dispatch.Verdict).
	outcomes = []string{"done", "retry", "dead"}
	// AnswerClasses are the classes of Answers, in the order of
	// AnswerClass's results.
	AnswerClasses = []string{"2xx", "3xx", "4xx", "5xx", "error", "none"}
	// pacerOps are the operations of PacerCalls.
	pacerOps = []string{"admit", "reserve", "pause", "reserve_pair"}
)

// AnswerClass is the index in AnswerClasses of a target's answer:
// status is its HTTP status (0: none), failed whether the delivery got no
// answer (a transport error or timeout). A status outside 200–599 counts
// as error.
func AnswerClass(status int, failed bool) int {
	switch {
	case status >= 200 && status < 600:
		return status/100 - 2
	case status == 0 && !failed:
		return 5
	}
	return 4
}

// InitLane makes every series of lane exist from now on, at 0: each
// counter with every label combination it can take, each histogram, and
// the lane's JetStream-derived gauges (until the first SetQueue). PacerUp
// and EffectiveRate, whose 0 would mean something, and the gauges of
// WatchLane and WatchMissed are the lane's to create with their values.
func (m *Metrics) InitLane(lane string) {
	for _, sa := range submittedAs {
		m.Submitted.WithLabelValues(lane, sa[0], sa[1])
	}
	for _, r := range rejectReasons {
		m.Rejected.WithLabelValues(lane, r)
	}
	for _, o := range outcomes {
		m.Dispatched.WithLabelValues(lane, o)
		for _, c := range AnswerClasses {
			m.Answers.WithLabelValues(lane, o, c)
		}
	}
	for _, op := range pacerOps {
		m.PacerCalls.WithLabelValues(lane, op)
	}
	for _, v := range []*prometheus.HistogramVec{m.DispatchSeconds, m.StartLateness, m.QueueWait, m.EndToEnd} {
		v.WithLabelValues(lane)
	}
	for _, v := range []*prometheus.CounterVec{m.SlotsReserved, m.LanePaused, m.DeadLettered} {
		v.WithLabelValues(lane)
	}
	m.Inflight.WithLabelValues(lane)
	m.PausedSeconds.WithLabelValues(lane)
	m.lanes.add(lane)
}

// LaneState is a lane's own state, read each time the metrics are
// gathered.
type LaneState struct {
	// Rate (jobs/s) and Burst are the configured limit: the file's, or
	// the one PATCH set.
	Rate  float64
	Burst int
	// Utilization is the jobs this instance started over the last minute
	// divided by what the configured rate allows in that time; summed over
	// the instances, the lane's.
	Utilization float64
	// Paused: a downstream asked the lane to wait, and the wait lasts.
	Paused bool
	// PausedByOperator: an operator holds the lane (PATCH
	// {"paused": true}) until resumed.
	PausedByOperator bool
	// MaxBacklog and MaxInflight are the lane's bounds (the file's), so
	// that the backlog and in-flight gauges can be alerted on against
	// them before intake answers 429; 0 MaxBacklog: unbounded.
	MaxBacklog  int64
	MaxInflight int
	// KeysActive and KeysPaused count, on a keyed lane, the keys with
	// jobs that this instance reads, and those of them a downstream asked
	// to wait; 0 on other lanes.
	KeysActive, KeysPaused int
}

// LaneQueue is what JetStream said of a lane, for the whole fleet.
type LaneQueue struct {
	// Backlog is the jobs stored in the lane: waiting or in flight.
	Backlog uint64
	// Oldest is when the oldest of them was stored; zero when none.
	Oldest time.Time
	// Retrying is the lane's jobs in the retry stream: failed jobs waiting
	// for their next attempt, and delayed jobs not yet due.
	Retrying uint64
	// Dead is the lane's dead letters.
	Dead uint64
}

// WatchLane exposes the lane's configured rate and burst, utilization and
// pause, read from state at every gather. Call it once per lane, after
// InitLane.
func (m *Metrics) WatchLane(lane string, state func() LaneState) {
	m.lanes.watch(lane, state)
}

// SetQueue records what JetStream said of lane; its gauges show it until
// the next call. The oldest job's age is computed at every gather, so it
// keeps growing between reads (and while JetStream cannot be read).
func (m *Metrics) SetQueue(lane string, q LaneQueue) {
	m.lanes.setQueue(lane, q)
}

// laneCollector is the per-lane gauges that are read, not set: the lanes'
// own state (WatchLane) and the JetStream reads (SetQueue).
type laneCollector struct {
	rate, burst, utilization, paused *prometheus.Desc
	operatorPaused, maxBacklog       *prometheus.Desc
	maxInflight                      *prometheus.Desc
	keysActive, keysPaused           *prometheus.Desc
	backlog, oldest, retrying, dead  *prometheus.Desc
	clock                            clock.Clock // ages at the gather (only Now)

	mu     sync.Mutex
	order  []string
	states map[string]func() LaneState
	queues map[string]LaneQueue
}

func newLaneCollector() *laneCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"lane"}, nil)
	}
	return &laneCollector{
		rate:           d("throttler_lane_configured_rate", "Rate the lane is configured to drain at (file or PATCH), jobs per second."),
		burst:          d("throttler_lane_burst", "Burst of the lane's token bucket (file or PATCH), jobs."),
		utilization:    d("throttler_lane_utilization", "Jobs this instance started over the last minute, divided by what the configured rate allows in it; sum over instances for the lane's."),
		paused:         d("throttler_lane_paused", "1 while a downstream's pause (Retry-After, exhausted rate limit) holds the lane, else 0."),
		operatorPaused: d("throttler_lane_paused_by_operator", "1 while an operator holds the lane (PATCH /v1/lanes/{lane} with paused true): jobs are queued, none starts; else 0."),
		maxBacklog:     d("throttler_lane_max_backlog", "The lane's max_backlog, jobs: intake answers 429 once the backlog reaches it; 0 when unbounded."),
		maxInflight:    d("throttler_lane_max_inflight", "The lane's max_inflight: the most deliveries in flight at once across the fleet."),
		keysActive:     d("throttler_lane_keys_active", "Keys of a keyed lane with jobs that this instance reads; sum over instances for the lane's (0 on a lane without per_key)."),
		keysPaused:     d("throttler_lane_keys_paused", "Of those, keys a downstream asked to wait (Retry-After, exhausted rate limit), on this instance."),
		backlog:        d("throttler_lane_backlog", "Jobs stored in the lane, waiting or in flight, across all instances (from JetStream)."),
		oldest:         d("throttler_lane_oldest_job_age_seconds", "Age of the oldest job stored in the lane, waiting or in flight; 0 when none (from JetStream)."),
		retrying:       d("throttler_lane_retrying", "Jobs of the lane waiting in the retry stream, across all instances (from JetStream): failed jobs waiting for their next attempt, and delayed jobs not yet due."),
		dead:           d("throttler_lane_dead_letters", "Dead letters of the lane, across all instances (from JetStream)."),
		clock:          clock.Real,
		states:         map[string]func() LaneState{},
		queues:         map[string]LaneQueue{},
	}
}

func (c *laneCollector) add(lane string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.queues[lane]; !ok {
		c.order = append(c.order, lane)
		c.queues[lane] = LaneQueue{}
	}
}

func (c *laneCollector) watch(lane string, state func() LaneState) {
	c.add(lane)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.states[lane] = state
}

func (c *laneCollector) setQueue(lane string, q LaneQueue) {
	c.add(lane)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queues[lane] = q
}

// Describe implements prometheus.Collector.
func (c *laneCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rate, c.burst, c.utilization, c.paused, c.operatorPaused, c.maxBacklog, c.maxInflight, c.keysActive, c.keysPaused, c.backlog, c.oldest, c.retrying, c.dead} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The lanes' state functions run
// outside the collector's lock.
func (c *laneCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	order := append([]string(nil), c.order...)
	states := make([]func() LaneState, len(order))
	queues := make([]LaneQueue, len(order))
	for i, lane := range order {
		states[i], queues[i] = c.states[lane], c.queues[lane]
	}
	c.mu.Unlock()
	now := c.clock.Now()
	gauge := func(d *prometheus.Desc, v float64, lane string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lane)
	}
	for i, lane := range order {
		if state := states[i]; state != nil {
			s := state()
			paused := 0.0
			if s.Paused {
				paused = 1
			}
			gauge(c.rate, s.Rate, lane)
			gauge(c.burst, float64(s.Burst), lane)
			gauge(c.utilization, s.Utilization, lane)
			gauge(c.paused, paused, lane)
			held := 0.0
			if s.PausedByOperator {
				held = 1
			}
			gauge(c.operatorPaused, held, lane)
			gauge(c.maxBacklog, float64(s.MaxBacklog), lane)
			gauge(c.maxInflight, float64(s.MaxInflight), lane)
			gauge(c.keysActive, float64(s.KeysActive), lane)
			gauge(c.keysPaused, float64(s.KeysPaused), lane)
		}
		q := queues[i]
		age := 0.0
		if !q.Oldest.IsZero() {
			age = max(now.Sub(q.Oldest).Seconds(), 0)
		}
		gauge(c.backlog, float64(q.Backlog), lane)
		gauge(c.oldest, age, lane)
		gauge(c.retrying, float64(q.Retrying), lane)
		gauge(c.dead, float64(q.Dead), lane)
	}
}
