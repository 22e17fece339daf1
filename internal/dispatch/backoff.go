package dispatch

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is exponential backoff with full jitter (the "Full Jitter" of
// AWS's "Exponential Backoff and Jitter"): the delay before attempt n+1 is
// uniform in [0, min(Max, Base·2^(n-1))]. Jitter spreads the retries of
// many jobs that failed together, so they do not hit the target in a clump.
//
// The zero value gives no delay. Max ≤ 0 means no cap. Backoff is a value
// and safe for concurrent use.
type Backoff struct {
	// Base is the ceiling after the first attempt.
	Base time.Duration
	// Max caps the ceiling.
	Max time.Duration
}

// Delay returns the wait after the given failed attempt (1 for the first;
// values below 1 count as 1). rnd returns a number in [0, 1) (values
// outside are clamped to [0, 1]); nil means math/rand/v2's Float64.
func (b Backoff) Delay(attempt int, rnd func() float64) time.Duration {
	ceil := b.ceiling(attempt)
	if ceil <= 0 {
		return 0
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	r := rnd()
	if math.IsNaN(r) {
		r = 0
	}
	r = min(max(r, 0), 1)
	d := time.Duration(r * float64(ceil))
	if d < 0 || d > ceil { // float rounding near the int64 limit
		d = ceil
	}
	return d
}

// ceiling returns min(Max, Base·2^(attempt-1)) without overflow.
func (b Backoff) ceiling(attempt int) time.Duration {
	if b.Base <= 0 {
		return 0
	}
	limit := b.Max
	if limit <= 0 {
		limit = time.Duration(1<<63 - 1)
	}
	c := min(b.Base, limit)
	for i := 1; i < attempt && c < limit; i++ {
		if c > limit/2 {
			return limit
		}
		c *= 2
	}
	return c
}
