package api

import "errors"

// Refusals that more than one part of the throttler reports, declared once
// here: the parts that meet them may not import each other (the pure
// admission decision and the JetStream adapter, the lanes and the HTTP
// API), and each answers a client with the same problem.
var (
	// ErrBacklogFull: a lane holds as much work as it may take (its
	// max_backlog, or max_wait's worth of jobs); answered 429 with a
	// backlog-full problem. The admission decision's refusal and the
	// queue's (the lane's stream at its max_backlog) both match it.
	ErrBacklogFull = errors.New("the lane's backlog is full")
	// ErrNotKeyed: a per-key operation on a lane without per_key; answered
	// 404 naming the lane.
	ErrNotKeyed = errors.New("the lane is not keyed (no per_key)")
	// ErrJobNotFound: no record of a job (never stored, on a lane without
	// results, or older than its lane's results.keep); answered 404.
	ErrJobNotFound = errors.New("no record of the job")
	// ErrJobStarted: a job that started or settled cannot be cancelled;
	// answered 409.
	ErrJobStarted = errors.New("the job has started or settled")
)
