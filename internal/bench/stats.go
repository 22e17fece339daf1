package bench

import (
	"math"
	"slices"
	"time"
)

// percentile returns the p-th percentile (0 ≤ p ≤ 100) of ds by the
// nearest-rank method; ds is sorted in place. Zero for an empty slice.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	if !slices.IsSorted(ds) {
		slices.Sort(ds)
	}
	rank := int(math.Ceil(p / 100 * float64(len(ds))))
	rank = min(max(rank, 1), len(ds))
	return ds[rank-1]
}

// latencies summarises a set of durations.
type latencies struct {
	N             int
	P50, P99, Max time.Duration
}

func summarise(ds []time.Duration) latencies {
	if len(ds) == 0 {
		return latencies{}
	}
	slices.Sort(ds)
	return latencies{N: len(ds), P50: percentile(ds, 50), P99: percentile(ds, 99), Max: ds[len(ds)-1]}
}

// pacing is how evenly a series of start times follows a period.
type pacing struct {
	// N is the number of starts.
	N int
	// Dev is |gap − period| over consecutive starts.
	Dev latencies
	// MaxPerSecond is the largest number of starts in any window of one
	// second (half-open, [t, t+1s)), at every start t.
	MaxPerSecond int
	// Achieved is (N−1) / (last − first) in starts per second.
	Achieved float64
	// Span is last − first.
	Span time.Duration
	// CPU is the cores the whole bench process (service, sink, reference)
	// used while the side ran, when measured (lanePacing); zero otherwise.
	CPU float64
}

// pacingOf computes the pacing statistics of starts against period; starts
// is sorted in place.
func pacingOf(starts []time.Time, period time.Duration) pacing {
	p := pacing{N: len(starts)}
	if len(starts) < 2 {
		return p
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	dev := make([]time.Duration, 0, len(starts)-1)
	for i := 1; i < len(starts); i++ {
		d := starts[i].Sub(starts[i-1]) - period
		if d < 0 {
			d = -d
		}
		dev = append(dev, d)
	}
	p.Dev = summarise(dev)
	p.MaxPerSecond = maxInWindow(starts, time.Second)
	p.Span = starts[len(starts)-1].Sub(starts[0])
	if p.Span > 0 {
		p.Achieved = float64(len(starts)-1) / p.Span.Seconds()
	}
	return p
}

// maxInWindow is the largest count of sorted times in any half-open window
// [t, t+w) that starts at one of them (the maximum over all windows).
func maxInWindow(sorted []time.Time, w time.Duration) int {
	best, j := 0, 0
	for i := range sorted {
		if j < i {
			j = i
		}
		for j < len(sorted) && sorted[j].Sub(sorted[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// rate is n events over d, per second; zero when d is not positive.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
