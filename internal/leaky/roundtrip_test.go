package leaky_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/leaky"
)

// rttPacer puts a store round trip on the virtual clock: odd calls are
// answered late in the round trip (the store's now early in it), even calls
// early, so that reservations have return legs of their own.
type rttPacer struct {
	leaky.StorePacer
	clk   *stallClock
	rtt   time.Duration
	calls int
}

func (p *rttPacer) Reserve(ctx context.Context, n int) (bucket.Reservation, error) {
	p.calls++
	before, after := time.Duration(0), p.rtt
	if p.calls%2 == 0 {
		before, after = p.rtt, 0
	}
	p.clk.Advance(before)
	r, err := p.StorePacer.Reserve(ctx, n)
	p.clk.Advance(after)
	return r, err
}

// oneAtATime hands out one item per Next, as a queue whose jobs trickle in:
// a reservation per job, each with its own round trip.
type oneAtATime struct{ *sliceSource }

func (s oneAtATime) Next(ctx context.Context, _ int) ([]item, error) {
	return s.sliceSource.Next(ctx, 1)
}

// TestStoreRoundTripKeepsWholePeriodWindows: with a store 0.9 ms away at
// 1,000 jobs/s, burst 1 (a round trip under τ + T − lateGrace), and one
// short stall anywhere in the run, no window of whole periods holds more
// than burst + rate·W starts. A deadline counted from when the answer came
// (due + slack) instead of from the slot's theoretical time broke this in
// about half of these runs: the last slot of a reservation answered late in
// its round trip started late beside the next one's on-time slots.
func TestStoreRoundTripKeepsWholePeriodWindows(t *testing.T) {
	l := bucket.Limit{Rate: 1000, Burst: 1}
	bad, runs := 0, 0
	for _, stall := range []time.Duration{300 * time.Microsecond, 500 * time.Microsecond, 700 * time.Microsecond} {
		for at := 50 * time.Millisecond; at < 90*time.Millisecond; at += 200 * time.Microsecond {
			runs++
			clk := &stallClock{Manual: buckettest.NewClock(), stallAt: at, stall: stall}
			starts, _ := drainStalled(t, l, clk, 200,
				func(p leaky.StorePacer) leaky.Pacer {
					return &rttPacer{StorePacer: p, clk: clk, rtt: 900 * time.Microsecond}
				},
				func(s *sliceSource) leaky.Source[item] { return oneAtATime{s} })
			if ex, got, allowed := maxInWholeWindows(starts, l, 150); ex > 0 {
				bad++
				if bad <= 3 {
					t.Errorf("stall %v at %v: %d starts in a window of %d periods where G1 allows %d", stall, at, got, allowed-l.Burst, allowed)
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d runs put more than burst + rate·W starts in a window of whole periods", bad, runs)
	}
}
