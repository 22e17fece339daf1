package lane

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
)

// windowSeconds is the span over which a lane's utilization is measured:
// starts over the last minute against the configured rate.
const windowSeconds = 60

// startWindow counts starts per second over the last windowSeconds.
// The zero value is empty; first marks the beginning of the count (the
// lane's start), so that a lane younger than the window is measured over
// its life. Safe for concurrent use.
type startWindow struct {
	mu    sync.Mutex
	first time.Time
	n     [windowSeconds]int64 // starts in the second held in sec, by second mod windowSeconds
	sec   [windowSeconds]int64 // the Unix second each slot counts
}

// begin marks the start of counting.
func (w *startWindow) begin(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.first = now
}

// add counts one start at now.
func (w *startWindow) add(now time.Time) {
	s := now.Unix()
	i := s % windowSeconds
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sec[i] != s {
		w.sec[i], w.n[i] = s, 0
	}
	w.n[i]++
}

// count returns the starts of the window that ends at now, and the span
// they were counted over: the last windowSeconds-1 whole seconds and the
// current part of one, or less while the lane is younger than that.
func (w *startWindow) count(now time.Time) (int64, time.Duration) {
	s := now.Unix()
	w.mu.Lock()
	defer w.mu.Unlock()
	var n int64
	for i := range w.sec {
		if w.sec[i] > s-windowSeconds && w.sec[i] <= s {
			n += w.n[i]
		}
	}
	from := time.Unix(s-windowSeconds+1, 0)
	if w.first.After(from) {
		from = w.first
	}
	return n, now.Sub(from)
}

// utilization is the starts over the window divided by what rate allows
// in it: 1 is a lane running at its configured rate. Bursts can take it
// somewhat over 1.
func utilization(starts int64, span time.Duration, rate float64) float64 {
	if span <= 0 || rate <= 0 {
		return 0
	}
	return float64(starts) / (rate * span.Seconds())
}

// metricState is the lane's state for the per-lane gauges read at every
// gather (metrics.WatchLane).
func (l *Lane) metricState() metrics.LaneState {
	lim := *l.limit.Load()
	now := l.d.Clock.Now()
	n, span := l.starts.count(now)
	l.mu.Lock()
	paused := now.Before(l.pauseTill)
	l.mu.Unlock()
	st := metrics.LaneState{Rate: lim.Rate, Burst: lim.Burst, Utilization: utilization(n, span, lim.Rate), Paused: paused,
		PausedByOperator: l.Held(), MaxBacklog: l.cfg.MaxBacklog, MaxInflight: l.cfg.MaxInflight}
	if k := l.keyed; k != nil {
		ks := k.Stats(now)
		st.KeysActive, st.KeysPaused = ks.Active, ks.Paused
	}
	return st
}

// started records the start of msg's delivery: its queue wait, and one
// start for the utilization.
func (l *Lane) started(msg *queue.Msg) {
	now := l.d.Clock.Now()
	l.starts.add(now)
	l.startsTotal.Add(1)
	l.hot.queueWait.Observe(max(now.Sub(msg.StoredAt()), 0).Seconds())
}

// settled records a job that left the lane for good (delivered, or
// dead-lettered): its time from first being stored.
func (l *Lane) settled(msg *queue.Msg) {
	if at := msg.EnqueuedAt(); !at.IsZero() {
		l.hot.endToEnd.Observe(max(l.d.Clock.Now().Sub(at), 0).Seconds())
	}
}

// hotMetrics are the lane's series that every job touches, looked up once
// instead of hashing the lane's name on every start and settle.
type hotMetrics struct {
	inflight        prometheus.Gauge
	queueWait       prometheus.Observer
	endToEnd        prometheus.Observer
	dispatchSeconds prometheus.Observer
	done, retry     prometheus.Counter
	dead            prometheus.Counter
	// answers are throttler_dispatch_answers_total by verdict (Done,
	// Retry, Dead) and metrics.AnswerClass.
	answers [3][]prometheus.Counter
	m       *metrics.Metrics
	lane    string
}

func newHotMetrics(m *metrics.Metrics, lane string) hotMetrics {
	var answers [3][]prometheus.Counter
	for i, v := range []dispatch.Verdict{dispatch.Done, dispatch.Retry, dispatch.Dead} {
		for _, c := range metrics.AnswerClasses {
			answers[i] = append(answers[i], m.Answers.WithLabelValues(lane, v.String(), c))
		}
	}
	return hotMetrics{
		answers:         answers,
		inflight:        m.Inflight.WithLabelValues(lane),
		queueWait:       m.QueueWait.WithLabelValues(lane),
		endToEnd:        m.EndToEnd.WithLabelValues(lane),
		dispatchSeconds: m.DispatchSeconds.WithLabelValues(lane),
		done:            m.Dispatched.WithLabelValues(lane, dispatch.Done.String()),
		retry:           m.Dispatched.WithLabelValues(lane, dispatch.Retry.String()),
		dead:            m.Dispatched.WithLabelValues(lane, dispatch.Dead.String()),
		m:               m,
		lane:            lane,
	}
}

// answered counts res in throttler_dispatch_answers_total.
func (h hotMetrics) answered(res dispatch.Result) {
	class := metrics.AnswerClass(res.Status, res.Err != nil)
	switch res.Verdict {
	case dispatch.Done:
		h.answers[0][class].Inc()
	case dispatch.Retry:
		h.answers[1][class].Inc()
	case dispatch.Dead:
		h.answers[2][class].Inc()
	default:
		h.m.Answers.WithLabelValues(h.lane, res.Verdict.String(), metrics.AnswerClasses[class]).Inc()
	}
}

// dispatched is the throttler_dispatched_total series of outcome v.
func (h hotMetrics) dispatched(v dispatch.Verdict) prometheus.Counter {
	switch v {
	case dispatch.Done:
		return h.done
	case dispatch.Retry:
		return h.retry
	case dispatch.Dead:
		return h.dead
	}
	return h.m.Dispatched.WithLabelValues(h.lane, v.String())
}

// recordWrites are the lane's throttler_job_record_writes_total series,
// looked up once when the lane starts; nil counters for a lane that keeps
// no records (its drain writes none).
type recordWrites struct {
	claimOK, claimOtherOwner, claimNotStartable, claimError prometheus.Counter
	endOK, endError                                         prometheus.Counter
}

// newRecordWrites makes the series of a lane that keeps records, at 0.
func newRecordWrites(m *metrics.Metrics, lane string) recordWrites {
	m.InitRecordWrites(lane)
	c := func(write, result string) prometheus.Counter {
		return m.RecordWrites.WithLabelValues(lane, write, result)
	}
	return recordWrites{
		claimOK:           c(metrics.RecordClaim, metrics.RecordOK),
		claimOtherOwner:   c(metrics.RecordClaim, metrics.RecordOtherOwner),
		claimNotStartable: c(metrics.RecordClaim, metrics.RecordNotStartable),
		claimError:        c(metrics.RecordClaim, metrics.RecordError),
		endOK:             c(metrics.RecordEnd, metrics.RecordOK),
		endError:          c(metrics.RecordEnd, metrics.RecordError),
	}
}
