// Package metrics defines every Prometheus collector of the throttler on a
// registry the caller owns (no default registry, no package-level state).
// Names carry the throttler_ prefix and base units; labels are per lane,
// never per key (keys are unbounded).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the collectors. Safe for concurrent use.
type Metrics struct {
	// Submitted counts jobs accepted over HTTP by lane and state (admitted,
	// queued, duplicate). Jobs published straight to NATS never pass intake;
	// they show in Dispatched.
	Submitted *prometheus.CounterVec
	// Rejected counts refused submissions by lane and reason.
	Rejected *prometheus.CounterVec
	// Dispatched counts deliveries by lane and outcome (done, retry, dead).
	Dispatched *prometheus.CounterVec
	// Answers counts deliveries by lane, outcome and the class of the
	// target's answer (2xx, 3xx, 4xx, 5xx; error: no answer, a transport
	// error or timeout; none: a target without HTTP status answered, NATS
	// or a handler). Kept apart from Dispatched, whose series dashboards and
	// rules already match on.
	Answers *prometheus.CounterVec
	// DispatchSeconds is the time one delivery took.
	DispatchSeconds *prometheus.HistogramVec
	// StartLateness is how late a dispatch started relative to its slot.
	StartLateness *prometheus.HistogramVec
	// Inflight is deliveries running now on this instance, per lane.
	Inflight *prometheus.GaugeVec
	// SlotsReserved counts dispatch slots reserved from the lane state.
	SlotsReserved *prometheus.CounterVec
	// PacerCalls counts calls to the lane state store by operation.
	PacerCalls *prometheus.CounterVec
	// PacerUp is 1 while the lane's drain can reserve slots, 0 while paused
	// because the state store is away.
	PacerUp *prometheus.GaugeVec
	// LanePaused counts pauses a downstream asked for.
	LanePaused *prometheus.CounterVec
	// DeadLettered counts jobs moved to the dead-letter stream.
	DeadLettered *prometheus.CounterVec
	// EffectiveRate is the rate a lane drains at now (jobs/s): its configured
	// rate, or less while adaptive mode slows it down.
	EffectiveRate *prometheus.GaugeVec
	// PausedSeconds is how long the lane still waits for a downstream's
	// Retry-After or rate-limit reset; 0 when not paused.
	PausedSeconds *prometheus.GaugeVec
	// QueueWait is how long a job waited in its lane, from being stored to
	// the start of its delivery.
	QueueWait *prometheus.HistogramVec
	// EndToEnd is how long a job took from being stored first to being
	// settled: delivered, or dead-lettered (retries included).
	EndToEnd *prometheus.HistogramVec

	// PullRepliesRefused counts reply subjects of pull-mode workers that
	// were refused and never answered, by lane and reason (malformed,
	// not_inbox, not_worker).
	PullRepliesRefused *prometheus.CounterVec

	// RecordWrites counts the drain's writes of job records (lanes with
	// results) by lane, write (RecordClaim, RecordEnd) and result
	// (RecordOK, RecordOtherOwner, RecordNotStartable, RecordError). Its
	// series exist for lanes that keep records (InitRecordWrites).
	RecordWrites *prometheus.CounterVec

	// Callers are the caller quota collectors.
	Callers *Callers
	// HTTP are the API's own requests.
	HTTP *HTTP
	// Backends are the NATS and Redis health gauges.
	Backends *Backends

	reg   prometheus.Registerer
	lanes *laneCollector
}

// WatchMissed exposes a lane's given-up slots (leaky.Drain.Missed) as
// throttler_slots_missed_total{lane}: slots reserved but not used within
// their lateness bound, capacity lost to stalls or idle fetches.
func (m *Metrics) WatchMissed(lane string, missed func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "throttler_slots_missed_total",
		Help:        "Dispatch slots given up because no job could start in them in time.",
		ConstLabels: prometheus.Labels{"lane": lane},
	}, func() float64 { return float64(missed()) }))
}

// WatchRestored exposes how many lane states the Redis store restored after
// Redis had lost them (redisbucket.Store.Restored) as
// throttler_pacer_states_restored_total.
func (m *Metrics) WatchRestored(restored func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "throttler_pacer_states_restored_total",
		Help: "Lane states the Redis store found missing although this instance had seen them ahead (Redis lost its data) and restored as empty buckets.",
	}, func() float64 { return float64(restored()) }))
}

// waitBuckets span 1 ms to 4.7 h (×4 each): a queue wait is anything from
// an immediate start to a long backlog, and retries stretch end-to-end
// times to hours.
var waitBuckets = prometheus.ExponentialBuckets(0.001, 4, 13)

// UnknownLane is the lane label of refused submissions to lanes that do
// not exist (their names are unbounded).
const UnknownLane = "_unknown"

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	lane := []string{"lane"}
	m := &Metrics{
		reg: reg, lanes: newLaneCollector(),
		Submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_jobs_submitted_total", Help: "Jobs accepted, by lane, state and source.",
		}, []string{"lane", "state", "source"}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_jobs_rejected_total", Help: "Submissions refused, by lane and reason.",
		}, []string{"lane", "reason"}),
		Dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_dispatches_total", Help: "Deliveries to targets, by lane and outcome.",
		}, []string{"lane", "outcome"}),
		Answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_dispatch_answers_total", Help: "Deliveries to targets, by lane, outcome (done, retry, dead) and class of the target's answer (2xx, 3xx, 4xx, 5xx, error: none came, none: a NATS or handler target without HTTP status).",
		}, []string{"lane", "outcome", "class"}),
		DispatchSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "throttler_dispatch_duration_seconds", Help: "Time one delivery took.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, lane),
		StartLateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "throttler_dispatch_start_lateness_seconds", Help: "How late a dispatch started after its slot.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14),
		}, lane),
		Inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttler_dispatches_inflight", Help: "Deliveries running now on this instance.",
		}, lane),
		SlotsReserved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_slots_reserved_total", Help: "Dispatch slots reserved from the lane state.",
		}, lane),
		PacerCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_pacer_calls_total", Help: "Calls to the lane state store, by lane and operation.",
		}, []string{"lane", "op"}),
		PacerUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttler_pacer_up", Help: "1 while the lane's drain can reserve slots, 0 while the state store is away.",
		}, lane),
		LanePaused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_lane_pauses_total", Help: "Pauses a downstream asked for (Retry-After, RateLimit).",
		}, lane),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_jobs_dead_lettered_total", Help: "Jobs moved to the dead-letter stream, by lane.",
		}, lane),
		EffectiveRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttler_lane_effective_rate", Help: "Rate the lane drains at now, jobs per second.",
		}, lane),
		PausedSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttler_lane_paused_seconds", Help: "Length of the pause a downstream asked of this instance, while it lasts; 0 when not paused.",
		}, lane),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "throttler_job_queue_wait_seconds", Help: "Time a job waited in its lane, from being stored to the start of its delivery.",
			Buckets: waitBuckets,
		}, lane),
		EndToEnd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "throttler_job_end_to_end_seconds", Help: "Time from a job's first storing to its settling (delivered or dead-lettered), retries included.",
			Buckets: waitBuckets,
		}, lane),
		PullRepliesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_pull_replies_refused_total", Help: "Reply subjects of pull-mode workers refused and never answered (outside the inbox of a worker of the lane), by lane and reason.",
		}, []string{"lane", "reason"}),
		RecordWrites: newRecordWrites(),
	}
	reg.MustRegister(m.QueueWait, m.EndToEnd, m.lanes, m.PullRepliesRefused, m.RecordWrites)
	m.Callers = newCallers(reg)
	m.HTTP = newHTTP(reg)
	m.Backends = newBackends(reg)
	// Refusals of unknown lanes count under one lane name (ingest).
	m.Rejected.WithLabelValues(UnknownLane, "unknown_lane")
	reg.MustRegister(m.EffectiveRate, m.PausedSeconds, m.DeadLettered, m.Submitted, m.Rejected, m.Dispatched, m.Answers, m.DispatchSeconds, m.StartLateness,
		m.Inflight, m.SlotsReserved, m.PacerCalls, m.PacerUp, m.LanePaused)
	return m
}
