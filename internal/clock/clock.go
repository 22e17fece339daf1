// Package clock is the one shape of time in the throttler: Now, and a Sleep
// that a context cancels. Everything that reads the time or waits takes a
// Clock, so that tests drive it: Real is the system clock, Manual a clock a
// test moves by hand (virtual time).
//
// Algorithms that only compare instants take now as an argument instead
// (bucket.Admit, leaky.AIMD); a Clock is for what sleeps or reads the time
// itself.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock tells the time and sleeps. Implementations are safe for concurrent
// use.
type Clock interface {
	Now() time.Time
	// Sleep waits for d or until ctx ends, and returns ctx's error if it
	// ended first. A d of zero or less returns at once with ctx's error.
	Sleep(ctx context.Context, d time.Duration) error
}

type system struct{}

func (system) Now() time.Time { return time.Now() }

// timers are stopped timers for Sleep to reuse: a drain waits once per
// slot (up to thousands of times a second), and a timer made per wait is
// garbage, allocated on the way to the next slot, where a GC assist drafts
// the allocating goroutine.
// Since Go 1.23 a stopped or reset timer never delivers a stale value, so a
// timer from the pool behaves like a new one.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

func (system) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t, _ := timers.Get().(*time.Timer) // only *time.Timer is ever put
	t.Reset(d)
	defer func() {
		t.Stop()
		timers.Put(t)
	}()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Real is the system clock (monotonic readings).
var Real Clock = system{}

// Manual is a clock that moves only when told: Advance moves it, and Sleep
// moves it by the whole wait at once, so that code under test runs in
// virtual time on one goroutine. Safe for concurrent use.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// NewManual returns a manual clock set to t.
func NewManual(t time.Time) *Manual { return &Manual{now: t} }

// Now implements Clock.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleep implements Clock: it advances the clock by d (when positive) and
// returns ctx's error.
func (c *Manual) Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		c.Advance(d)
	}
	return ctx.Err()
}
