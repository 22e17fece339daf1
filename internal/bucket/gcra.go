// Package bucket is the one home of a lane's rate state: the generic cell rate
// algorithm (GCRA) that both admission and the leaky drain use, and the Store
// interface that keeps that state in memory (single instance) or in Redis (many
// instances, see package redisbucket).
//
// The model: a lane (or one key of a keyed lane) has a rate r (jobs per second)
// and a burst b. Its whole state is one number, the theoretical arrival time
// tat. With period T = 1/r and tolerance τ = (b-1)·T:
//
//   - Admit at now: allowed iff now ≥ tat − τ; then tat = max(tat, now) + T.
//   - Reserve n slots at now: base = max(tat, now); slot i starts at
//     max(now, base + i·T − τ); then tat = base + n·T.
//
// Over any window W this never starts more than b + r·W jobs (G1). Because the
// drain reserves the slot of the next queued job as soon as it holds it, a lane
// with a backlog keeps its bucket empty, so new arrivals queue behind the
// backlog instead of overtaking it.
//
// The functions in this file are pure: they take now as an argument and import
// no client library.
package bucket

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// MaxRate bounds the rate of one lane or key. Above it the period would be
// shorter than a microsecond, the resolution of the Redis store.
const MaxRate = 1_000_000

// MaxBurst bounds the burst of one lane or key.
const MaxBurst = 1_000_000

// MinRate bounds the rate from below: one job per about 11.6 days.
const MinRate = 1e-6

// maxHorizon bounds burst·period, the longest span the state math must
// represent; well inside time.Duration and the Redis store's exact range.
const maxHorizon = 100 * 24 * time.Hour

// ErrInvalidLimit is returned for a Limit that cannot be used (see
// Limit.Validate); Limit.Validate's errors are *LimitError values that match
// it.
var ErrInvalidLimit = errors.New("bucket: invalid limit")

// LimitError is the error of Limit.Validate and Quota.Rate: it names the field at fault so
// that a caller can report it in its own words (a config path, a problem
// field). It matches ErrInvalidLimit under errors.Is.
type LimitError struct {
	// Field is "rate" or "burst" (Limit.Validate), or "limit", "per" or
	// "burst" (Quota.Rate).
	Field string
	// Msg says what is wrong, without the field name.
	Msg string
}

// Error implements error: "bucket: invalid limit: rate must be …".
func (e *LimitError) Error() string {
	return ErrInvalidLimit.Error() + ": " + e.Field + " " + e.Msg
}

// Is reports whether target is ErrInvalidLimit.
func (e *LimitError) Is(target error) bool { return target == ErrInvalidLimit }

// Limit is a rate and a burst. The zero value is invalid: a lane must say how
// fast it drains.
type Limit struct {
	// Rate is in jobs per second; fractional rates are allowed (0.5 is one job
	// every two seconds). It must be finite and in [MinRate, MaxRate].
	Rate float64
	// Burst is how many jobs an idle lane admits at once; at least 1.
	Burst int
}

// Validate reports whether l can reach the state math; the error is a
// *LimitError. It is called before a limit reaches any store so that a zero
// or NaN rate never becomes an infinite period in a script.
func (l Limit) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &LimitError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	// An if chain rather than a switch: the coverage profile (and so a
	// mutation run over it) sees if conditions, not case expressions.
	if math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate <= 0 {
		return bad("rate", "must be a number greater than 0 (jobs per second), got %v", l.Rate)
	}
	if l.Rate < MinRate || l.Rate > MaxRate {
		return bad("rate", "must be between %v and %d jobs per second, got %v", MinRate, MaxRate, l.Rate)
	}
	if l.Burst < 1 || l.Burst > MaxBurst {
		return bad("burst", "must be between 1 and %d, got %d", MaxBurst, l.Burst)
	}
	if float64(l.Burst)/l.Rate > maxHorizon.Seconds() {
		return bad("burst", "too large for the rate: %d jobs at %v/s take longer than %v to refill", l.Burst, l.Rate, maxHorizon)
	}
	return nil
}

// Period is the time between two jobs at the limit's rate, rounded up to the
// nanosecond so that rounding can only slow a lane down, never speed it up.
func (l Limit) Period() time.Duration {
	return time.Duration(math.Ceil(float64(time.Second) / l.Rate))
}

// Tolerance is τ = (burst−1)·period: how far ahead of tat a job may start.
func (l Limit) Tolerance() time.Duration {
	return time.Duration(l.Burst-1) * l.Period()
}

// String formats the limit as "20/s burst 10".
func (l Limit) String() string {
	return fmt.Sprintf("%g/s burst %d", l.Rate, l.Burst)
}

// Decision is the outcome of one admission check.
type Decision struct {
	// Allowed is true when the job took a token and may start now.
	Allowed bool
	// Remaining is how many more jobs would be admitted right now.
	Remaining int
	// RetryAfter is how long until the next job would be admitted; zero when
	// Remaining > 0.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Reservation is a run of n consecutive dispatch slots. Slot i starts Delay(i)
// after the moment the store read its clock; the delays never decrease.
type Reservation struct {
	// N is the number of slots reserved.
	N int
	// First is the offset of slot 0's earliest start from the store's now,
	// before clamping at zero: negative when the bucket had room.
	First time.Duration
	// Period is the spacing of consecutive slots.
	Period time.Duration
	// Tolerance is the limit's τ = (burst−1)·Period: how far before its
	// theoretical time (Latest) a slot may start.
	Tolerance time.Duration
	// At is the store's clock reading that Delay and Latest count from
	// (Redis TIME for the Redis store), so that a caller can place the
	// slots on the store's time line rather than on when the answer
	// reached it; zero when the store does not tell.
	At time.Time
}

// Delay is how long after the reservation slot i may start: max(0, First + i·Period).
func (r Reservation) Delay(i int) time.Duration {
	return max(r.First+time.Duration(i)*r.Period, 0)
}

// Latest is how long after the reservation slot i may still start with
// the limit kept exactly: its theoretical time in the state, First + i·Period
// + Tolerance. Every slot ever reserved from one state has its own
// theoretical time, a Period or more from any other's, and starts in
// [Latest − Tolerance, Latest] (Delay clamps at zero, which is only ever
// later). So starts taken anywhere in those intervals, by any number of
// holders, put at most burst + rate·W in any window W: a slot reached late
// (a stall) may still be used up to Latest, which is Tolerance after Delay
// when the bucket was empty and later when it had room.
func (r Reservation) Latest(i int) time.Duration {
	return r.First + time.Duration(i)*r.Period + r.Tolerance
}

// Admit applies one admission check at now to the state tat (zero time means a
// fresh, full bucket). It returns the decision and the new tat, which equals tat
// when the job was not allowed.
func Admit(now, tat time.Time, l Limit) (Decision, time.Time) {
	return AdmitN(now, tat, l, 1)
}

// AdmitN is Admit for a request that costs n tokens at once (a batch of n
// jobs, or a lane whose jobs cost more than one token): allowed iff the
// bucket holds n tokens now, that is now ≥ tat + (n−1)·T − τ; then tat =
// max(tat, now) + n·T. AdmitN(now, tat, l, 1) is Admit. n = 0 takes nothing
// and reports the state (Allowed is then true unless the bucket's next
// token is more than a period away).
// A cost over the burst is never allowed; callers refuse it before asking.
func AdmitN(now, tat time.Time, l Limit, n int) (Decision, time.Time) {
	period, tau := l.Period(), l.Tolerance()
	if tat.Before(now) {
		tat = now
	}
	cost := time.Duration(n) * period
	allowAt := tat.Add(cost - period - tau)
	if now.Before(allowAt) {
		return Decision{
			Allowed:    false,
			Remaining:  0,
			RetryAfter: allowAt.Sub(now),
			ResetAfter: tat.Sub(now),
		}, tat
	}
	newTAT := tat.Add(cost)
	d := Decision{Allowed: true, ResetAfter: newTAT.Sub(now)}
	d.Remaining = remaining(now, newTAT, period, tau)
	if d.Remaining == 0 {
		d.RetryAfter = newTAT.Add(-tau).Sub(now)
	}
	return d, newTAT
}

// Peek reports what Admit would answer at now without changing the state.
func Peek(now, tat time.Time, l Limit) Decision {
	d, _ := Admit(now, tat, l)
	if !d.Allowed {
		return d
	}
	// Admit counted the job it allowed; Peek takes nothing.
	if tat.Before(now) {
		tat = now
	}
	return Decision{Allowed: true, Remaining: remaining(now, tat, l.Period(), l.Tolerance()), ResetAfter: tat.Sub(now)}
}

// remaining counts the whole periods between now and tat − τ, that is the
// number of further jobs that would be admitted at now.
func remaining(now, tat time.Time, period, tau time.Duration) int {
	slack := now.Sub(tat.Add(-tau))
	if slack < 0 {
		return 0
	}
	return int(slack/period) + 1
}

// Reserve reserves n ≥ 1 consecutive slots at now from the state tat and returns
// the reservation and the new tat. It always succeeds: a full bucket only makes
// the slots start later.
func Reserve(now, tat time.Time, l Limit, n int) (Reservation, time.Time) {
	n = max(n, 1)
	period, tau := l.Period(), l.Tolerance()
	base := tat
	if base.Before(now) {
		base = now
	}
	r := Reservation{N: n, First: base.Add(-tau).Sub(now), Period: period, Tolerance: tau, At: now}
	return r, base.Add(time.Duration(n) * period)
}

// Pause pushes the state so that no slot starts before until: tat becomes at
// least until + τ. The bucket then refills from empty after until, so a lane
// that a downstream asked to wait does not burst the moment the wait ends.
func Pause(tat, until time.Time, l Limit) time.Time {
	if p := until.Add(l.Tolerance()); tat.Before(p) {
		return p
	}
	return tat
}

// IdleAfter is how long a state stays meaningful after tat: once the bucket is
// full again (now ≥ tat) the state equals a fresh one and may be dropped.
func IdleAfter(now, tat time.Time) time.Duration {
	return max(tat.Sub(now), 0)
}
