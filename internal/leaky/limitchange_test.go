package leaky_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/leaky"
)

// TestLoweredLimitGivesUpSlotsInHand: a lane's limit is lowered at run
// time (PATCH, adaptive mode's decrease) while its drain holds slots
// reserved under the old one. Those slots are given up before any of them
// starts, so every window from the change on keeps the new limit's
// burst + rate·W, checked on the start times. Before, the drain started
// the slots it held at the old spacing first: at 1,000/s lowered to 10/s,
// 16 starts in the 15 ms after the change where the new limit allows 1;
// with the burst lowered from 100 to 1 after the first start, 19 more at
// once.
// A raised limit keeps the slots in hand: they fit in the new bound, and
// giving them up would only cost capacity.
func TestLoweredLimitGivesUpSlotsInHand(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to bucket.Limit
		// at: the limit changes once this many jobs started.
		at   int
		kept bool // the slots in hand are kept
	}{
		{name: "rate", from: bucket.Limit{Rate: 1000, Burst: 1}, to: bucket.Limit{Rate: 10, Burst: 1}, at: 105},
		// The first reservation takes 20 slots due at once from the full
		// bucket; the burst is lowered after the first start.
		{name: "burst", from: bucket.Limit{Rate: 1000, Burst: 100}, to: bucket.Limit{Rate: 1000, Burst: 1}, at: 1},
		// A slot is in hand at the change (batch 2): the next job takes it.
		{name: "raised", from: bucket.Limit{Rate: 100, Burst: 1}, to: bucket.Limit{Rate: 1000, Burst: 5}, at: 51, kept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := buckettest.NewClock()
			t0 := clock.Now()
			ctx, cancel := virtualCtx(t)
			defer cancel()
			src := &sliceSource{items: items(tc.at + 40), cancel: cancel}
			var changed atomic.Bool
			limit := func() bucket.Limit {
				if changed.Load() {
					return tc.to
				}
				return tc.from
			}
			var starts, after []time.Duration
			d, err := leaky.New(leaky.Config[item]{
				Source:      src,
				Pacer:       leaky.StorePacer{Store: &bucket.Memory{Clock: clock}, Key: bucket.Key{Lane: "l"}, Limit: limit},
				MaxInflight: 64,
				Batch:       leaky.BatchFor(tc.from.Rate, 64),
				Clock:       clock,
				Start: func(_ context.Context, it item, done func()) {
					at := clock.Now().Sub(t0)
					starts = append(starts, at)
					if changed.Load() {
						after = append(after, at)
					}
					if it.n != len(starts)-1 {
						t.Errorf("start %d is job %d: order broken", len(starts)-1, it.n)
					}
					if len(starts) == tc.at {
						changed.Store(true)
					}
					done()
					src.started()
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			d.Run(ctx)
			if len(starts) != tc.at+40 {
				t.Fatalf("%d starts, want %d", len(starts), tc.at+40)
			}
			// From the change on, the new limit alone.
			buckettest.CheckWindows(t, after, tc.to, 0)
			if gap := starts[tc.at] - starts[tc.at-1]; tc.kept && gap != tc.from.Period() {
				t.Errorf("first start after a raised limit %v after the last before it, want %v (the slot in hand)", gap, tc.from.Period())
			}
		})
	}
}
