package leaky

import (
	"sync"
	"time"
)

// AIMD adapts a lane's rate to a downstream that pushes back: a rate-limit
// answer cuts the rate by Decrease (multiplicative decrease, at most once per
// Interval, so that one burst of 429s from jobs already in flight counts
// once), and every Interval without one adds Increase of the configured rate
// back (additive increase). The result is a factor in [Min, 1] that
// multiplies the configured rate: never above it.
//
// Set the fields before first use. Safe for concurrent use. Methods take
// now so that tests drive time.
type AIMD struct {
	Decrease float64       // e.g. 0.5
	Increase float64       // e.g. 0.05
	Min      float64       // e.g. 0.1
	Interval time.Duration // e.g. 5s

	mu           sync.Mutex
	started      bool
	factor       float64
	lastDecrease time.Time
	lastStep     time.Time // the last increase step, or the last decrease
}

// settle applies the increase steps due by now. Callers hold mu.
func (a *AIMD) settle(now time.Time) {
	if !a.started {
		a.started, a.factor, a.lastStep = true, 1, now
		a.lastDecrease = now.Add(-a.Interval)
		return
	}
	if a.Interval <= 0 {
		a.lastStep = now
		return
	}
	// Whole intervals since the last step (none if the clock went back);
	// at a factor of 1 they add nothing.
	steps := max(now.Sub(a.lastStep)/a.Interval, 0)
	a.factor = min(1, a.factor+float64(steps)*a.Increase)
	a.lastStep = a.lastStep.Add(steps * a.Interval)
}

// Factor is the multiplier of the configured rate at now.
func (a *AIMD) Factor(now time.Time) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle(now)
	return a.factor
}

// Limited records a rate-limit answer at now. It returns the new factor and
// whether this answer changed it.
func (a *AIMD) Limited(now time.Time) (float64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle(now)
	// Any rate-limit answer postpones the next increase.
	a.lastStep = now
	if now.Sub(a.lastDecrease) < a.Interval {
		return a.factor, false
	}
	a.factor = max(a.Min, a.factor*a.Decrease)
	a.lastDecrease, a.lastStep = now, now
	return a.factor, true
}

// Adopt takes a lower factor that another instance decided at now, so
// that every instance slows down together. It reports whether the factor
// changed. A factor decided before this one's last decrease or step never
// moves them back: the next decrease and the next increase stay as far
// away as they were.
func (a *AIMD) Adopt(factor float64, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settle(now)
	if factor >= a.factor {
		return false
	}
	a.factor = max(a.Min, factor)
	a.lastDecrease, a.lastStep = later(now, a.lastDecrease), later(now, a.lastStep)
	return true
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
