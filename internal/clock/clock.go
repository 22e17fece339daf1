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
	"runtime"
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

// A Go timer in an otherwise idle process wakes through the netpoller,
// whose wait has whole-millisecond resolution on Linux: a wait of 9.6 ms
// sleeps 9 ms, then 1 ms more, and lands up to a millisecond late (about
// 0.4–0.6 ms at the median, measured); a wait of 100 µs lands about 1 ms
// late. So a wait is made of a timer until preciseLead before its end, and
// the rest in the kernel (finish: nanosleep on Linux, a few tens of µs
// late). That is not a spin: the thread sleeps, uses no CPU while it waits
// and keeps its time slice. A drain at 10,000 jobs/s then wakes once per
// slot, within its lateness bound, instead of once a millisecond for ten
// slots of which it must give most up: 99.8 % of the rate instead of 85 %
// (leaky TestRealClockTenThousandPerSecond), for about a tenth of a core.
const preciseLead = time.Millisecond

func (system) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if !canFinish {
		return timerSleep(ctx, d)
	}
	end := time.Now().Add(d)
	if d > preciseLead {
		if err := timerSleep(ctx, d-preciseLead); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// A thread in a system call keeps its P until the runtime's monitor
	// takes it back (20 µs to 10 ms later), and with it the goroutines
	// queued there: the delivery a drain just started with go, on the
	// slot before. Yielding first lets them run (they block on the
	// network in µs); measured with the other P busy, a goroutine started
	// before the wait ran after p99 25 ms without the yield and 1 ms with.
	runtime.Gosched()
	// At most preciseLead (plus a late timer's lateness, which only
	// shortens it) in the kernel: a cancel during it is seen when it ends.
	finish(end)
	return ctx.Err()
}

// timerSleep waits for d on a pooled timer, or until ctx ends.
func timerSleep(ctx context.Context, d time.Duration) error {
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
