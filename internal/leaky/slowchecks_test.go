package leaky_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/leaky"
)

// TestChecksSlowerThanAPeriodStillStart: at the highest rate (a period of
// 1 µs, the bench's drained lanes) the drain's checks between taking a slot
// and starting in it (the hold, the pause, the clock) take longer than a
// period, here three periods of virtual time per start (the race detector
// and a loaded machine did it for real). Before, the start's check found
// its slot passed every time, gave it up and took the next, which its
// checks missed in turn: the lane started nothing while it gave up
// millions of slots (a resumed lane of the records bench brought no job in
// 10 s under -race). Now the start takes the slot in hand whose window
// holds the moment: every item starts, once, in order, and every window of
// whole periods keeps G1 (checked on the start times).
func TestChecksSlowerThanAPeriodStillStart(t *testing.T) {
	t.Parallel()
	clk := buckettest.NewClock()
	t0 := clk.Now()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	const n = 300
	src := &sliceSource{items: items(n), cancel: cancel}
	l := bucket.Limit{Rate: bucket.MaxRate, Burst: 1}
	checks := 0
	var starts []time.Duration
	var order []int
	d, err := leaky.New(leaky.Config[item]{
		Source: src,
		Pacer:  leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		PausedUntil: func() time.Time {
			// The slow checks; a run that keeps checking without
			// starting is stopped (the old livelock) rather than hung.
			clk.Advance(3 * l.Period())
			if checks++; checks > 100*n {
				cancel()
			}
			return time.Time{}
		},
		Start: func(_ context.Context, it item, done func()) {
			starts = append(starts, clk.Now().Sub(t0))
			order = append(order, it.n)
			done()
			src.started()
		},
		MaxInflight: 64,
		Batch:       leaky.BatchFor(l.Rate, 64),
		Clock:       clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	if len(starts) != n {
		t.Fatalf("%d of %d items started after %d checks (%d slots given up)", len(starts), n, checks, d.Missed())
	}
	for i, it := range order {
		if it != i {
			t.Fatalf("start %d is item %d: order broken", i, it)
		}
	}
	if ex, got, allowed := maxInWholeWindows(starts, l, 200); ex > 0 {
		t.Errorf("%d starts in a window where G1 allows %d", got, allowed)
	}
}
