// Package dispatch delivers one job to its target and classifies the outcome:
// done, retry (after a delay), or dead. It knows nothing of queues or pacing:
// the caller decides when a job starts and what to do with the verdict.
//
// Targets: HTTP (webhooks, third-party APIs), NATS (worker pools, request/
// reply) and in-process Go handlers (library use). An HTTP target's
// downstream signals (429/503 with Retry-After, RateLimit headers) come back
// as Result.PauseLane so that the caller can hold the whole lane.
package dispatch

import (
	"context"
	"time"

	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/tracectx"
)

// Job is what a target receives.
type Job struct {
	// ID is the job's idempotency key; targets receive it as the
	// Idempotency-Key header.
	ID          string
	Lane        string
	Key         string
	ContentType string
	Payload     []byte
	// Attempt counts deliveries: 1 for the first.
	Attempt    int
	EnqueuedAt time.Time
	// Trace is the W3C trace context the target receives (traceparent,
	// tracestate, baggage headers); the zero value sends none.
	Trace tracectx.Context
	// Dest is where the job asks to go within an HTTP lane's target
	// (method, path or URL, forwarded headers); the zero value goes to
	// the target as configured. Other targets ignore it.
	Dest dest.Request
	// KeyTarget, on a keyed lane, is where the job's key sends its jobs
	// (its override's URL, headers and signing secret); nil: the lane's
	// target as configured.
	KeyTarget *KeyTarget
}

// Verdict is the class of a delivery's outcome.
type Verdict int

const (
	// Done: the target took the job; ack it.
	Done Verdict = iota
	// Retry: deliver again later (after Result.RetryAfter, or backoff).
	Retry
	// Dead: the target refused the job for good; retrying will not help.
	Dead
)

func (v Verdict) String() string {
	switch v {
	case Done:
		return "done"
	case Retry:
		return "retry"
	case Dead:
		return "dead"
	}
	return "unknown"
}

// Result describes one delivery.
type Result struct {
	Verdict Verdict
	// Status is the HTTP status (0 for other targets or no response).
	Status int
	// Err is the transport or target error, if any.
	Err error
	// RetryAfter is how long the target asked to wait before this job is
	// tried again; zero leaves it to the retry policy.
	RetryAfter time.Duration
	// PauseLane is how long the downstream asked the whole lane to wait
	// (429/503 Retry-After, an exhausted RateLimit); zero for none.
	PauseLane time.Duration
	// Unstarted: the job never reached the target (no worker took it,
	// or a worker handed it back unstarted); it goes back to the queue at
	// once and no attempt is counted.
	Unstarted bool
	// Took is how long the delivery took.
	Took time.Duration
	// Response is what the target answered, when the target keeps it
	// (HTTPConfig.Capture); nil otherwise.
	Response *Response
}

// Target delivers jobs. Implementations are safe for concurrent use and
// honour ctx (cancelled at shutdown or timeout).
type Target interface {
	Deliver(ctx context.Context, job Job) Result
}

// Handler adapts a function to a Target, for use as a library.
type Handler func(ctx context.Context, job Job) Result

// Deliver implements Target; it fills Result.Took when the function left it
// zero.
func (h Handler) Deliver(ctx context.Context, job Job) Result {
	return timed(func() Result { return h(ctx, job) })
}

// timed runs deliver and records how long it took, unless deliver did.
func timed(deliver func() Result) Result {
	start := time.Now()
	res := deliver()
	if res.Took == 0 {
		res.Took = time.Since(start)
	}
	return res
}
