// Package admission makes the intake decision for one job: queue it (it
// waits in the lane's queue and is drained at the lane's rate), possibly to
// start at once, or reject it (the backlog is over max_backlog or
// max_wait). An empty bucket is never a reason to reject: that is what the
// queue is for.
//
// Admission only looks at the lane's GCRA state (Peek); it takes nothing.
// The drain is the one place that takes slots, in queue order, so a job
// starts at once exactly when the lane is idle with room in its bucket and
// nothing waits ahead of it. Admission tells intake whether the bucket has
// room now (then intake waits briefly to hear the slot the drain gives the
// job, and answers "admitted" only for one due at once) and estimates the
// wait otherwise. A job that admission decided on never costs a token: a
// duplicate submission, or one the queue refuses, leaves the state as it
// was.
//
// When the store is unreachable (Redis away) admission answers as if the
// bucket had no room: the job is kept, and the drain starts it once slots
// can be reserved again.
package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
)

// ErrBacklogFull is matched (errors.Is) by a *RejectError: the lane holds too
// much work to take more now. It is api.ErrBacklogFull, which the queue's
// refusal of a job over max_backlog matches too.
var ErrBacklogFull = api.ErrBacklogFull

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

// Decision is the answer for an accepted job, with what the rate-limit
// response headers need.
type Decision struct {
	// Room: the lane's bucket has room now, so the job may start at once if
	// the drain gives it the next slot; intake waits to hear.
	Room bool
	// SlotWait is how long until the lane's next free slot; zero with room.
	SlotWait time.Duration
	// Backlog is the lane's backlog count the decision saw.
	Backlog int64
	// Limit is the lane's bucket (burst and rate) for the headers.
	Limit bucket.Limit
	// Remaining is how many more jobs the bucket has room for now.
	Remaining int
	// Reset is when the bucket is full again.
	Reset time.Duration
	// Degraded is true when the state store could not be asked; the job is
	// queued as the safe answer.
	Degraded bool
	// Step is the time between two starts of the jobs ahead (Lane.Step).
	Step time.Duration
}

// ETA estimates the wait of a job with ahead jobs queued before it: the
// wait for the lane's (and key's) next free slot, then one step per job
// ahead. While the bucket has room (a drain has not yet taken it: it
// lags, or it has not fetched the jobs ahead), the jobs ahead take its
// Remaining tokens first, and only those past them wait a step each. It
// assumes the rate is what holds the jobs back (not max_inflight, a pause,
// or on a keyed lane other keys sharing a binding lane cap).
func (d Decision) ETA(ahead int64) time.Duration {
	step := d.Step
	if step <= 0 {
		step = d.Limit.Period()
	}
	if d.Room && d.Remaining > 0 {
		return waitFor(max(ahead-int64(d.Remaining)+1, 0), step)
	}
	return d.SlotWait + waitFor(ahead, step)
}

// Lane is what admission needs to know of a lane.
type Lane struct {
	Name       string
	Limit      bucket.Limit
	MaxBacklog int64
	// MaxWait refuses jobs whose estimated wait is longer; zero: no bound.
	MaxWait time.Duration
	// KeyLimit, on a keyed lane, is the job's key's limit: a job has room
	// only when both its key's bucket and the lane's have. nil: not keyed.
	KeyLimit *bucket.Limit
}

// Step is the time between two starts of the jobs a job waits behind: the
// lane's period, or on a keyed lane (where those are its key's jobs) the
// longer of the key's and the lane's: a key never starts faster than the
// lane's cap.
func (l Lane) Step() time.Duration {
	if l.KeyLimit == nil {
		return l.Limit.Period()
	}
	return max(l.Limit.Period(), l.KeyLimit.Period())
}

// Backlog counts a lane's stored, unfinished jobs (waiting or in flight),
// from a count no older than maxAge (0: read it now).
type Backlog interface {
	Backlog(ctx context.Context, lane string, maxAge time.Duration) (int64, error)
}

// BacklogMaxAge is how old a backlog count may be for ETAs. A rejection is
// always decided on a fresh count.
const BacklogMaxAge = 250 * time.Millisecond

// Peeker reads a GCRA state without changing it (bucket.Store.Peek).
type Peeker interface {
	Peek(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error)
}

// Config configures an Admitter.
type Config struct {
	Store   Peeker
	Backlog Backlog
	Logger  *slog.Logger
}

// Admitter decides. Safe for concurrent use.
type Admitter struct {
	store   Peeker
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
// never come back: an unreachable store or backlog counter degrades to "no
// room", and the queue itself enforces max_backlog exactly.
func (a *Admitter) Decide(ctx context.Context, lane Lane, key string) (Decision, error) {
	return a.decide(ctx, lane, key, nil)
}

// PeekMaxAge is how old a peek handed to DecideFrom may be.
const PeekMaxAge = 50 * time.Millisecond

// Peeked is a peek of a lane's state read elsewhere (package redisquota
// reads it in the caller quotas' round trip): D, what bucket.Peek answered,
// At the local time the answer arrived.
type Peeked struct {
	D  bucket.Decision
	At time.Time
}

// DecideFrom is Decide for a job of a lane that is not keyed, on a peek of
// its state already made: the decision then costs no call to the store.
// A peek older than PeekMaxAge, or one whose next free slot has come
// since (the room it saw is out of date), is read again as Decide does;
// otherwise its waits are shortened by its age. now is the local time.
func (a *Admitter) DecideFrom(ctx context.Context, lane Lane, p Peeked, now time.Time) (Decision, error) {
	age := now.Sub(p.At)
	if lane.KeyLimit != nil || age < 0 || age > PeekMaxAge || (!p.D.Allowed && p.D.RetryAfter <= age) {
		return a.decide(ctx, lane, "", nil)
	}
	d := p.D
	d.RetryAfter = max(d.RetryAfter-age, 0)
	d.ResetAfter = max(d.ResetAfter-age, 0)
	return a.decide(ctx, lane, "", &d)
}

// decide is Decide, on peeked instead of a call to the store when set.
func (a *Admitter) decide(ctx context.Context, lane Lane, key string, peeked *bucket.Decision) (Decision, error) {
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
	var d bucket.Decision
	var err error
	if peeked != nil {
		d = *peeked
	} else {
		d, err = a.peek(ctx, lane, key)
	}
	if err != nil {
		a.log.Warn("state store unavailable, queueing", "lane", lane.Name, "err", err)
		return Decision{Backlog: n, Limit: lane.Limit, Reset: wait, Degraded: true, Step: lane.Step()}, nil
	}
	return Decision{Room: d.Allowed, SlotWait: d.RetryAfter, Backlog: n, Limit: lane.Limit, Remaining: d.Remaining, Reset: d.ResetAfter, Step: lane.Step()}, nil
}

// DecideN decides on n jobs of lane (and key) submitted together, as n
// calls of Decide one after the other would if each job were stored before
// the next one is decided: job i counts the i jobs before it in the backlog
// (max_backlog, max_wait), in the bucket's room, and in its SlotWait (a
// job the bucket has no room for waits a period more per job of the batch
// queued before it: Decision.ETA then takes the jobs queued ahead of the
// whole batch). It reads the backlog and
// the state once. out[i] is job i's decision; errs[i], when not nil, is the
// *RejectError that refuses it (the jobs after a refused one are refused
// too: the backlog only grows within a batch).
func (a *Admitter) DecideN(ctx context.Context, lane Lane, key string, n int) (out []Decision, errs []error) {
	out, errs = make([]Decision, n), make([]error, n)
	if n == 0 {
		return out, errs
	}
	d, err := a.Decide(ctx, lane, key)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return out, errs
	}
	period := lane.Limit.Period()
	for i := range out {
		b := d.Backlog + int64(i)
		// An if chain rather than a switch: a mutation run sees if
		// conditions, not case expressions (docs/MUTATION.md).
		if b >= lane.MaxBacklog {
			errs[i] = &RejectError{Lane: lane.Name, Field: "max_backlog", Backlog: b, RetryAfter: waitFor(b-lane.MaxBacklog+1, period)}
			continue
		}
		if lane.MaxWait > 0 && waitFor(b, period) > lane.MaxWait {
			errs[i] = &RejectError{Lane: lane.Name, Field: "max_wait", Backlog: b, RetryAfter: waitFor(b, period) - lane.MaxWait}
			continue
		}
		di := d
		di.Backlog = b
		di.Room = d.Room && (i == 0 || i < d.Remaining)
		di.Remaining = max(d.Remaining-i, 0)
		if !di.Room {
			// Behind the jobs of the batch before it: the ones the bucket
			// has room for start at once, the others one period apart.
			queued := int64(i)
			if d.Room {
				queued = int64(i-max(d.Remaining, 1)) + 1
			}
			di.SlotWait = d.SlotWait + waitFor(queued, d.Step)
		}
		out[i] = di
	}
	return out, errs
}

// Refresh reads the lane's state again for d, which Decide made a while ago
// (intake waited to hear a slot): the next free slot has moved since. An
// unreachable store leaves d as it was.
func (a *Admitter) Refresh(ctx context.Context, lane Lane, key string, d Decision) Decision {
	p, err := a.peek(ctx, lane, key)
	if err != nil {
		return d
	}
	d.Room, d.SlotWait, d.Remaining, d.Reset = p.Allowed, p.RetryAfter, p.Remaining, p.ResetAfter
	return d
}

// peek reads the lane's state, and on a keyed lane the key's too: room only
// when both have it, the later of their next free slots.
func (a *Admitter) peek(ctx context.Context, lane Lane, key string) (bucket.Decision, error) {
	if lane.KeyLimit == nil {
		return a.store.Peek(ctx, bucket.Key{Lane: lane.Name, Sub: key}, lane.Limit)
	}
	d, err := a.store.Peek(ctx, bucket.Key{Lane: lane.Name}, lane.Limit)
	if err != nil || key == "" {
		return d, err
	}
	k, err := a.store.Peek(ctx, bucket.Key{Lane: lane.Name, Sub: key}, *lane.KeyLimit)
	if err != nil {
		return d, err
	}
	d.Allowed = d.Allowed && k.Allowed
	d.Remaining = min(d.Remaining, k.Remaining)
	d.RetryAfter = max(d.RetryAfter, k.RetryAfter)
	d.ResetAfter = max(d.ResetAfter, k.ResetAfter)
	if !d.Allowed {
		d.Remaining = 0
		if d.RetryAfter == 0 {
			d.RetryAfter = max(k.RetryAfter, time.Nanosecond)
		}
	}
	return d, nil
}

// waitFor is the time n jobs take to drain at one per period.
func waitFor(n int64, period time.Duration) time.Duration {
	w := float64(max(n, 0)) * float64(period)
	// float64(math.MaxInt64) is 2^63, one past the largest Duration: a
	// product equal to it does not convert either.
	if w >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(w)
}
