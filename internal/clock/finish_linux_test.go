package clock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/clock"
)

// TestRealSleepFinishesInTheKernel: on Linux a wait ends in the kernel
// (nanosleep), not on the netpoller's millisecond, so it lands closer to its
// end than a plain timer beside it: waits of 2.5 ms, one of each in turn,
// and the median lateness of Sleep must be at most half the timer's, or
// under 200 µs. A loaded machine delays both alike; the best of three rounds
// counts.
func TestRealSleepFinishesInTheKernel(t *testing.T) {
	const d, n = 2500 * time.Microsecond, 40
	median := func(s []time.Duration) time.Duration {
		slices.Sort(s)
		return s[len(s)/2]
	}
	var ours, timer time.Duration
	for round := range 3 {
		var o, tm []time.Duration
		for range n {
			start := time.Now()
			if err := clock.Real.Sleep(context.Background(), d); err != nil {
				t.Fatal(err)
			}
			o = append(o, time.Since(start)-d)
			start = time.Now()
			<-time.NewTimer(d).C
			tm = append(tm, time.Since(start)-d)
		}
		ours, timer = median(o), median(tm)
		t.Logf("round %d: median lateness %v (Sleep) against %v (a timer)", round+1, ours, timer)
		if ours < 0 {
			t.Fatalf("Sleep(%v) returned %v early", d, -ours)
		}
		if ours <= timer/2 || ours <= 200*time.Microsecond {
			return
		}
	}
	t.Fatalf("median lateness %v against a timer's %v: the wait does not finish in the kernel", ours, timer)
}
