package metrics

import "github.com/prometheus/client_golang/prometheus"

// Label values of RecordWrites: which write of a job's record (write) and
// what came of it (result).
const (
	// RecordClaim is the drain's claim of a record before an attempt.
	RecordClaim = "claim"
	// RecordEnd is the drain's write of an attempt's end.
	RecordEnd = "end"

	// RecordOK: the write was made.
	RecordOK = "ok"
	// RecordOtherOwner: the job's id has another caller's record; the job
	// is delivered without one (claims only).
	RecordOtherOwner = "other_owner"
	// RecordNotStartable: the job was cancelled or expired; it is not
	// delivered (claims only).
	RecordNotStartable = "not_startable"
	// RecordError: the write failed. A job whose claim failed waits and
	// comes again; an end that failed leaves the record as the claim made
	// it.
	RecordError = "error"
)

// recordWriteResults are the (write, result) pairs of RecordWrites.
var recordWriteResults = [][2]string{
	{RecordClaim, RecordOK}, {RecordClaim, RecordOtherOwner}, {RecordClaim, RecordNotStartable}, {RecordClaim, RecordError},
	{RecordEnd, RecordOK}, {RecordEnd, RecordError},
}

func newRecordWrites() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttler_job_record_writes_total",
		Help: "Writes of job records by the drain of a lane with results, by lane, write (claim: before an attempt; end: after it) and result (ok; other_owner: delivered without a record; not_startable: cancelled or expired, not delivered; error: the write failed, and a job whose claim failed waits and comes again).",
	}, []string{"lane", "write", "result"})
}

// InitRecordWrites makes every RecordWrites series of lane exist at 0;
// a lane that keeps records calls it when it starts, so that the first
// failed write is an increase rules see.
func (m *Metrics) InitRecordWrites(lane string) {
	for _, wr := range recordWriteResults {
		m.RecordWrites.WithLabelValues(lane, wr[0], wr[1])
	}
}

// WatchWaiters exposes how many callers wait on this instance for their
// jobs' answers (?wait=; records.Waiters.Waiting) as throttler_job_waiters.
func (m *Metrics) WatchWaiters(waiting func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "throttler_job_waiters",
		Help: "Requests waiting on this instance for their job's answer (?wait=).",
	}, func() float64 { return float64(waiting()) }))
}
