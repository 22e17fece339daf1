package leaky_test

import (
	"slices"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
)

// maxInWholeWindows is the most starts (sorted) in any closed window
// [start, start + m·T] for m up to maxM, and the bound burst + m that G1
// sets for it, at the m where the excess is largest.
func maxInWholeWindows(starts []time.Duration, l bucket.Limit, maxM int) (worst, got, allowed int) {
	s := slices.Clone(starts)
	slices.Sort(s)
	period := l.Period()
	worst = -1 << 30
	for i := range s {
		j := i
		for m := 1; m <= maxM; m++ {
			end := s[i] + time.Duration(m)*period
			for j < len(s) && s[j] <= end {
				j++
			}
			if ex := (j - i) - (l.Burst + m); ex > worst {
				worst, got, allowed = ex, j-i, l.Burst+m
			}
		}
	}
	return worst, got, allowed
}

// TestLateWakeKeepsWholePeriodWindows: at 1,000 jobs/s, burst 1, the drain
// wakes late once (a stall of 1.5 or 1.9 ms, under the old 2 ms lateness
// floor). Every window of a whole number of periods (a second at an integer
// rate is one) must hold at most burst + rate·W starts, checked on the
// start times themselves: a late start may not share its wake-up with the
// next slot's job. Before, both started together and the windows that began
// there held one start too many (1,002 in a second where 1,001 are
// allowed); the slot overslept by a period or more is given up instead.
func TestLateWakeKeepsWholePeriodWindows(t *testing.T) {
	t.Parallel()
	for _, stall := range []time.Duration{500 * time.Microsecond, 1500 * time.Microsecond, 1900 * time.Microsecond, 5 * time.Millisecond} {
		l := bucket.Limit{Rate: 1000, Burst: 1}
		clk := &stallClock{Manual: buckettest.NewClock(), stallAt: 100*time.Millisecond + 300*time.Microsecond, stall: stall}
		starts, d := runStalled(t, l, clk, 1500)
		if ex, got, allowed := maxInWholeWindows(starts, l, 1100); ex > 0 {
			t.Errorf("stall %v: %d starts in a window of %d periods where G1 allows %d (%d slots given up)", stall, got, allowed-l.Burst, allowed, d.Missed())
		}
		t.Logf("stall %v: %d slots given up", stall, d.Missed())
	}
}

// TestStallCaughtUpWithinBurst: a drain at 1,000 jobs/s with burst 20
// (τ = 19 ms) stalls once. A slot reached late may still start up to its
// theoretical time in the lane's state (τ after the slot once the bucket is
// empty): there the limit holds exactly, so a stall shorter than τ costs no
// slot (its slots start at once, a clump the burst allows) and a longer one
// costs only what it passed beyond τ. Every window keeps burst + rate·W
// exactly, checked on the start times (the stall hits the paced part, where
// every slot's theoretical time is τ after it), and every job starts once,
// in order.
func TestStallCaughtUpWithinBurst(t *testing.T) {
	l := bucket.Limit{Rate: 1000, Burst: 20}
	for _, tc := range []struct {
		stall, lost time.Duration
	}{
		// Shorter than τ: caught up, nothing lost. Before, every slot
		// more than 2 ms late was given up: 13 of them.
		{stall: 15 * time.Millisecond, lost: 0},
		// Longer than τ: the 40 ms stall passes 40 slots; the last 19 are
		// still within their theoretical time and start at once, the
		// rest (21 ms: reserved ones given up, later ones never reserved
		// as the state fell behind now) are lost.
		{stall: 40 * time.Millisecond, lost: 21 * time.Millisecond},
	} {
		t.Run(tc.stall.String(), func(t *testing.T) {
			clock := &stallClock{Manual: buckettest.NewClock(), stallAt: 100 * time.Millisecond, stall: tc.stall}
			starts, d := runStalled(t, l, clock, 300)
			if missed := d.Missed(); (missed == 0) != (tc.lost == 0) {
				t.Errorf("stall %v: %d slots missed, want some exactly when time is lost", tc.stall, missed)
			}
			// The first 20 start at once (the full bucket), the rest 1 ms
			// apart: job 299 at 280 ms, plus what the stall passed beyond
			// τ.
			if end, want := starts[len(starts)-1], 280*time.Millisecond+tc.lost; end != want {
				t.Errorf("last start at %v, want %v (%d slots missed)", end, want, d.Missed())
			}
			buckettest.CheckWindows(t, starts, l, 0)
			// The catch-up is a clump: the burst allows it, and G1 above
			// says it stays within it.
			clump := 0
			for i := range starts {
				j := i
				for j < len(starts) && starts[j] == starts[i] {
					j++
				}
				if starts[i] > 0 {
					clump = max(clump, j-i)
				}
			}
			if clump < 2 || clump > l.Burst {
				t.Errorf("largest clump after the stall %d, want 2 to %d (caught up within the burst)", clump, l.Burst)
			}
			t.Logf("stall %v: %d missed, largest clump %d", tc.stall, d.Missed(), clump)
		})
	}
}
