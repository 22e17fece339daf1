package admission

import (
	"math"
	"testing"
	"time"
)

// TestWaitFor: n jobs at one per period, clamped where the product leaves
// time.Duration's range (2^33 jobs of 2^30 ns is exactly 2^63 ns, one past
// the largest Duration).
func TestWaitFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n      int64
		period time.Duration
		want   time.Duration
	}{
		{-1, time.Second, 0},
		{0, time.Second, 0},
		{1, 50 * time.Millisecond, 50 * time.Millisecond},
		{3, 50 * time.Millisecond, 150 * time.Millisecond},
		{1 << 33, 1 << 30, math.MaxInt64},
		{math.MaxInt64, time.Hour, math.MaxInt64},
	} {
		if got := waitFor(tc.n, tc.period); got != tc.want {
			t.Errorf("waitFor(%d, %v) = %v, want %v", tc.n, tc.period, got, tc.want)
		}
	}
}
