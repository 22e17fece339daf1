// Package quota holds the caller quotas that protect the throttler and its
// tenants, kept apart from the lane limits that protect downstreams: a lane
// queues what is over its rate, a caller quota refuses it (429).
//
// Two layers, checked in this order for one request:
//
//  1. Per client IP, before the caller is known: a sliding-window counter
//     (the weighted sum of the previous and the current fixed window, as in
//     the Redis rate-limiting literature). A request costs 1; Limit requests
//     fit in any window of Length, within the error of the weighting.
//  2. Per caller (an API key, or the client IP for anonymous callers): a
//     token bucket (GCRA, package bucket) from the caller's plan. A request
//     costs n tokens (bucket.AdmitN): a batch of n jobs costs n, and a lane
//     may give each job a cost of its own.
//
// A caller's state is bounded by an empty bucket of its plan, so that a
// plan change holds from the next request.
//
// A refusal takes nothing: a refused request is not counted in the IP
// window and takes no token, so a caller over its quota gets back in as
// soon as the window slides or the bucket refills. Observation mode is the
// caller's business (package ingest): the state evolves exactly as under
// enforcement, only the answer differs, so the would-be refusals it counts
// are the refusals enforcement would make.
//
// The functions of this file are pure and take the time as an argument;
// Memory keeps the state of one instance, package redisquota the state of a
// fleet (one Lua script for both layers, on Redis TIME), and Failover falls
// back from the one to the other while Redis is away.
package quota

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// Window is the per-IP layer: at most Limit requests in any window of
// Length (sliding). Limit 0 turns the layer off.
type Window struct {
	Limit  int64
	Length time.Duration
}

// MaxWindow bounds Window.Length.
const MaxWindow = 24 * time.Hour

// Validate reports a window that cannot be used, naming the field (limit,
// window).
func (w Window) Validate() error {
	switch {
	case w.Limit < 0 || w.Limit > 1_000_000_000:
		return &bucket.LimitError{Field: "limit", Msg: fmt.Sprintf("must be between 0 (off) and 1000000000, got %d", w.Limit)}
	case w.Limit > 0 && (w.Length < time.Second || w.Length > MaxWindow):
		return &bucket.LimitError{Field: "window", Msg: fmt.Sprintf("must be between 1s and %v, got %v", MaxWindow, w.Length)}
	case w.Length%time.Second != 0:
		return &bucket.LimitError{Field: "window", Msg: fmt.Sprintf("must be a whole number of seconds, got %v", w.Length)}
	}
	return nil
}

// On reports whether the layer is on.
func (w Window) On() bool { return w.Limit > 0 }

// WindowDecision is the per-IP layer's answer.
type WindowDecision struct {
	Allowed bool
	// Count is the weighted count the decision saw, before this request.
	Count float64
	// Remaining is how many more requests fit now (after this one, if it
	// was allowed).
	Remaining int64
	// RetryAfter is how long until a refused request would fit; zero when
	// allowed.
	RetryAfter time.Duration
	// Reset is how long until the current fixed window ends (when its count
	// starts to weigh less).
	Reset time.Duration
}

// Slide decides one request of cost at elapsed into the current fixed
// window, which holds cur requests, the previous one prev. The weighted
// count is prev·(1 − elapsed/Length) + cur; the request fits when that
// plus cost is at most Limit.
func Slide(elapsed time.Duration, prev, cur int64, w Window, cost int64) WindowDecision {
	length := float64(w.Length)
	e := float64(elapsed)
	count := float64(prev)*(length-e)/length + float64(cur)
	d := WindowDecision{Count: count, Reset: w.Length - elapsed}
	limit := float64(w.Limit)
	if count+float64(cost) <= limit {
		d.Allowed = true
		d.Remaining = int64(math.Floor(limit - count - float64(cost)))
		return d
	}
	d.RetryAfter = slideWait(e, length, float64(prev), float64(cur), limit-float64(cost))
	return d
}

// slideWait is how long until prev·(1 − t/L) + cur ≤ room, t measured from
// the current window's start at e; the next window's count (cur) decays
// in turn. It never answers less than a millisecond.
func slideWait(e, length, prev, cur, room float64) time.Duration {
	wait := math.Inf(1)
	switch {
	case room < 0:
	case cur <= room && prev > 0:
		// Within this window: prev·(1 − t/L) ≤ room − cur.
		t := length * (1 - (room-cur)/prev)
		wait = math.Max(t-e, 0)
	case cur <= room:
		wait = 0
	default:
		// In the next window, cur is the previous count.
		t := length * (1 - room/cur)
		wait = (length - e) + t
	}
	if math.IsInf(wait, 1) || wait > float64(MaxWindow*2) {
		return MaxWindow * 2
	}
	return max(time.Duration(math.Ceil(wait)), time.Millisecond)
}

// Request is one request to check. A layer whose key is empty is skipped.
type Request struct {
	// IP keys the per-IP layer (an address, or an IPv6 /64 prefix); PerIP
	// is its window.
	IP    string
	PerIP Window
	// ObserveIP lets the caller layer be checked even when the IP layer
	// refuses (the IP layer is observed, not enforced).
	ObserveIP bool
	// Caller keys the per-caller layer ("key:<id>", "ip:<addr>"); Plan is
	// its bucket and Cost the tokens the request takes (0: read the state
	// for the headers and take nothing).
	Caller string
	Plan   bucket.Limit
	Cost   int
	// Lane, when its Lane is set, also asks for a peek of that lane's
	// GCRA state under LaneLimit (bucket.Peek: it takes nothing), made in
	// the same round trip where the limiter can (Result.LaneChecked); the
	// caller peeks on its own otherwise (and always for a LaneLimit the
	// lane's store refuses). It changes no decision of the layers, and the
	// layers change nothing of the lane.
	Lane      bucket.Key
	LaneLimit bucket.Limit
}

// Result is the answer of both layers.
type Result struct {
	// IPChecked: the IP layer decided (IP and PerIP were set).
	IPChecked bool
	IP        WindowDecision
	// PlanChecked: the caller layer decided (Caller set, and the IP layer
	// allowed or was observed).
	PlanChecked bool
	Plan        bucket.Decision
	// LaneChecked: the lane's state was read with the layers' (Request.Lane
	// set, on a limiter that can fold it in: redisquota with its Lanes set).
	// Lane is what bucket.Peek answered, relative to the limiter's now.
	LaneChecked bool
	Lane        bucket.Decision
}

// Limiter checks requests against both layers atomically. Implementations
// are safe for concurrent use.
type Limiter interface {
	Check(ctx context.Context, r Request) (Result, error)
}

// ErrCostOverBurst: the request costs more tokens than its plan's burst; no
// wait makes it fit.
var ErrCostOverBurst = errors.New("quota: cost over the plan's burst")

// Validate checks a request before it reaches a store; errors wrap
// bucket.ErrInvalidLimit or ErrCostOverBurst.
func (r Request) Validate() error {
	if r.IP != "" {
		if err := r.PerIP.Validate(); err != nil {
			return err
		}
	}
	if r.Caller != "" {
		if err := r.Plan.Validate(); err != nil {
			return err
		}
		if r.Cost < 0 {
			return fmt.Errorf("%w: cost %d is negative", bucket.ErrInvalidLimit, r.Cost)
		}
		if r.Cost > r.Plan.Burst {
			return fmt.Errorf("%w: cost %d, burst %d", ErrCostOverBurst, r.Cost, r.Plan.Burst)
		}
	}
	return nil
}

// clampTAT bounds a caller's state by an empty bucket of its plan now
// (tat ≤ now + τ + T): a state left by a stricter plan then takes effect
// of the new plan at once, as it would for a new caller that spent its
// burst (a plan change holds from the next request).
func clampTAT(now, tat time.Time, l bucket.Limit) (time.Time, bool) {
	if lim := now.Add(l.Tolerance() + l.Period()); tat.After(lim) {
		return lim, true
	}
	return tat, false
}

// windowIndex is the fixed window that now falls in, and how far into it.
func windowIndex(now time.Time, length time.Duration) (int64, time.Duration) {
	ns := now.UnixNano()
	i := ns / int64(length)
	if ns < 0 && ns%int64(length) != 0 {
		i--
	}
	return i, time.Duration(ns - i*int64(length))
}

var planNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidPlanName reports whether name can name a plan: 1 to 64 letters,
// digits, '_' or '-' (the config file and the admin API share the rule).
func ValidPlanName(name string) bool { return planNameRe.MatchString(name) }
