// Package admission makes the intake decision for one job: admit it now
// (the lane's token bucket has room), queue it (no room: it waits in the
// lane's queue and is drained at the lane's rate), or reject it (the backlog
// is over max_backlog or max_wait). An empty bucket is never a reason to
// reject: that is what the queue is for.
//
// The bucket is the lane's GCRA state in a bucket.Store, the same state the
// drain reserves its slots from. Because the drain reserves the slot of the
// next queued job as soon as it holds it, a lane with a backlog keeps its
// bucket empty and new arrivals queue behind the backlog (FIFO) without any
// counter that could drift after a crash.
//
// When the store is unreachable (Redis away) admission answers Queued: the
// job is kept, and the drain starts it once slots can be reserved again.
package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// ErrBacklogFull is matched (errors.Is) by a *RejectError: the lane holds too
// much work to take more now.
var ErrBacklogFull = errors.New("admission: backlog full")

// RejectError says why a job was refused and when to try again.
type RejectError struct {
	Lane string
	// Field names the limit that refused: "max_backlog" or "max_wait".
	Field string
	// Backlog is the lane's backlog when the job was refused.
	Backlog int64
	// RetryAfter is the estimated time until the lane has room.
	RetryAfter time.Duration
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("admission: lane %s: backlog of %d jobs is over %s; retry after %v", e.Lane, e.Backlog, e.Field, e.RetryAfter.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrBacklogFull) true.
func (e *RejectError) Is(target error) bool { return target == ErrBacklogFull }

// State is the answer for an accepted job.
type State string

const (
	// Admitted: the job took a token and is dispatched at once.
	Admitted State = "admitted"
	// Queued: the job waits and is drained at the lane's rate.
	Queued State = "queued"
)

// Decision is the answer for an accepted job, with what the rate-limit
// response headers need.
type Decision struct {
	State State
	// ETA estimates the wait until dispatch.
	ETA time.Duration
	// Limit is the lane's bucket (burst and rate) for the headers.
	Limit bucket.Limit
	// Remaining is how many more jobs would be admitted at once.
	Remaining int
	// Reset is when the bucket is full again.
	Reset time.Duration
	// Degraded is true when the state store could not be asked and the job
	// was queued as the safe answer.
	Degraded bool
}

// Lane is what admission needs to know of a lane.
type Lane struct {
	Name       string
	Limit      bucket.Limit
	MaxBacklog int64
	// MaxWait refuses jobs whose estimated wait is longer; zero: no bound.
	MaxWait time.Duration
}

// Backlog counts a lane's stored, unfinished jobs (waiting or in flight),
// from a count no older than maxAge (0: read it now).
type Backlog interface {
	Backlog(ctx context.Context, lane string, maxAge time.Duration) (int64, error)
}

// BacklogMaxAge is how old a backlog count may be for ETAs. A rejection is
// always decided on a fresh count.
const BacklogMaxAge = 250 * time.Millisecond

// Config configures an Admitter.
type Config struct {
	Store   bucket.Store
	Backlog Backlog
	Logger  *slog.Logger
}

// Admitter decides. Safe for concurrent use.
type Admitter struct {
	store   bucket.Store
	backlog Backlog
	log     *slog.Logger
}

// New returns an Admitter; it starts nothing.
func New(cfg Config) (*Admitter, error) {
	if cfg.Store == nil || cfg.Backlog == nil {
		return nil, errors.New("admission: Config.Store and Config.Backlog are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Admitter{store: cfg.Store, backlog: cfg.Backlog, log: cfg.Logger}, nil
}

// Decide returns the decision for one job of lane (key "" for the lane-wide
// state), or a *RejectError when the lane is over its bounds. Other errors
// never come back: an unreachable store or backlog counter degrades to
// Queued, and the queue itself enforces max_backlog exactly.
func (a *Admitter) Decide(ctx context.Context, lane Lane, key string) (Decision, error) {
	period := lane.Limit.Period()
	n, berr := a.backlog.Backlog(ctx, lane.Name, BacklogMaxAge)
	if berr == nil && (n >= lane.MaxBacklog || (lane.MaxWait > 0 && waitFor(n, period) > lane.MaxWait)) {
		// About to refuse: decide on a fresh count, not a cached one.
		n, berr = a.backlog.Backlog(ctx, lane.Name, 0)
	}
	if berr != nil {
		a.log.Warn("backlog unknown, relying on the queue's own bound", "lane", lane.Name, "err", berr)
	}
	wait := waitFor(n, period)
	if n >= lane.MaxBacklog {
		return Decision{}, &RejectError{Lane: lane.Name, Field: "max_backlog", Backlog: n,
			RetryAfter: waitFor(n-lane.MaxBacklog+1, period)}
	}
	if lane.MaxWait > 0 && wait > lane.MaxWait {
		return Decision{}, &RejectError{Lane: lane.Name, Field: "max_wait", Backlog: n,
			RetryAfter: wait - lane.MaxWait}
	}
	k := bucket.Key{Lane: lane.Name, Sub: key}
	d, err := a.store.Admit(ctx, k, lane.Limit)
	if err != nil {
		a.log.Warn("state store unavailable, queueing", "lane", lane.Name, "err", err)
		return Decision{State: Queued, ETA: wait, Limit: lane.Limit, Reset: wait, Degraded: true}, nil
	}
	out := Decision{Limit: lane.Limit, Remaining: d.Remaining, Reset: d.ResetAfter}
	if d.Allowed {
		out.State = Admitted
		return out, nil
	}
	out.State = Queued
	out.ETA = max(d.RetryAfter, wait)
	return out, nil
}

// waitFor is the time n jobs take to drain at one per period.
func waitFor(n int64, period time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	w := float64(n) * float64(period)
	if w > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(w)
}
