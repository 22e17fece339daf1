package api

import "time"

// The NATS worker protocol (docs/WORKERS.md): header names and status
// values that a pull-mode lane's workers and the throttler exchange, for
// the server (internal/dispatch) and the public worker package alike.
const (
	// HeaderIdempotencyKey in a job is its id, the same on every attempt;
	// in a report, when present, it must be the id of the leased job.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderThrottleKey in a job is its key on a keyed lane.
	HeaderThrottleKey = "Throttle-Key"
	// HeaderLane in a job names its lane.
	HeaderLane = "Throttler-Lane"
	// HeaderKey in a job is its key on a keyed lane (the older name of
	// HeaderThrottleKey, kept for request-mode workers).
	HeaderKey = "Throttler-Key"
	// HeaderAttempt in a job is this attempt's number, 1 for the first.
	HeaderAttempt = "Throttler-Attempt"
	// HeaderStatus is a report's verdict, or the throttler's answer to a
	// pull request or a report.
	HeaderStatus = "Throttler-Status"
	// HeaderError is the reason given with a status.
	HeaderError = "Throttler-Error"
	// HeaderRetryAfter in a "retry" report is the wait in seconds.
	HeaderRetryAfter = "Retry-After"
	// HeaderExpires in a pull request is how long the worker waits for
	// an answer, in milliseconds.
	HeaderExpires = "Throttler-Expires"
	// HeaderWorker in a pull request names the worker, for logs only.
	HeaderWorker = "Throttler-Worker"
	// HeaderAck in a job is the subject its outcome is reported on (the
	// message's reply subject).
	HeaderAck = "Throttler-Ack"
	// HeaderLease in a job is its lease in milliseconds.
	HeaderLease = "Throttler-Lease"
)

// Values of HeaderStatus.
const (
	// Reports of a worker.
	StatusDone     = "done"
	StatusRetry    = "retry"
	StatusDead     = "dead"
	StatusRelease  = "release"  // back to the queue at once, unstarted
	StatusProgress = "progress" // extends the lease

	// Answers of the throttler.
	StatusEmpty    = "empty"    // no job for the pull request in time
	StatusAccepted = "accepted" // the report settled or extended its lease
	StatusRefused  = "refused"  // no such lease, or a malformed message
)

// Bounds of HeaderExpires, and its value when absent.
const (
	DefaultPullExpires = 4 * time.Second
	MinPullExpires     = 100 * time.Millisecond
	MaxPullExpires     = 5 * time.Minute
)
