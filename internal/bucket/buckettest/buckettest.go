// Package buckettest is the conformance suite every bucket.Store passes: the
// in-memory store and the Redis store run the same tests against an injected
// clock, so the two cannot drift apart.
package buckettest

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
)

// NewClock returns a manual clock set to a fixed instant, shared by a test
// and the store under test.
func NewClock() *clock.Manual {
	return clock.NewManual(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// Factory makes a fresh, empty store that reads its time from clock. Stores
// that keep time at a coarser resolution report it as Resolution.
type Factory func(t *testing.T, c *clock.Manual) bucket.Store

// Options tune the suite to one implementation.
type Options struct {
	// Resolution is the store's time resolution; durations it returns are
	// compared with this tolerance. Zero means exact.
	Resolution time.Duration
}

// Run runs the whole conformance suite against stores made by newStore.
func Run(t *testing.T, newStore Factory, opts Options) {
	tol := opts.Resolution
	near := func(t *testing.T, what string, got, want time.Duration) {
		t.Helper()
		if diff := got - want; diff > tol || diff < -tol {
			t.Errorf("%s = %v, want %v (±%v)", what, got, want, tol)
		}
	}
	ctx := context.Background()
	k := bucket.Key{Lane: "demo"}

	if _, ok := newStore(t, NewClock()).(bucket.PairStore); ok {
		runPair(t, newStore, near)
	}

	t.Run("AdmitBurstThenRefill", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 20, Burst: 10} // T = 50ms
		// Step table: t0..t9 are offsets from the start.
		steps := []struct {
			at        time.Duration
			allowed   bool
			remaining int
			retry     time.Duration
		}{
			{0, true, 9, 0},
			{0, true, 8, 0},
			{0, true, 7, 0},
			{0, true, 6, 0},
			{0, true, 5, 0},
			{0, true, 4, 0},
			{0, true, 3, 0},
			{0, true, 2, 0},
			{0, true, 1, 0},
			{0, true, 0, 50 * time.Millisecond},
			{0, false, 0, 50 * time.Millisecond},
			{49 * time.Millisecond, false, 0, time.Millisecond},
			{50 * time.Millisecond, true, 0, 50 * time.Millisecond},
			{200 * time.Millisecond, true, 2, 0},
		}
		start := clock.Now()
		for i, st := range steps {
			clock.Advance(start.Add(st.at).Sub(clock.Now()))
			d, err := s.Admit(ctx, k, l)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if d.Allowed != st.allowed || d.Remaining != st.remaining {
				t.Errorf("step %d at +%v: allowed=%v remaining=%d, want %v %d", i, st.at, d.Allowed, d.Remaining, st.allowed, st.remaining)
			}
			near(t, "RetryAfter", d.RetryAfter, st.retry)
		}
	})

	t.Run("ReserveSpacesSlotsAndKeepsBucketEmpty", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 20, Burst: 10}
		for i := 0; i < 10; i++ {
			if d, err := s.Admit(ctx, k, l); err != nil || !d.Allowed {
				t.Fatalf("admit %d: %+v %v", i, d, err)
			}
		}
		r, err := s.Reserve(ctx, k, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		near(t, "first slot", r.Delay(0), 50*time.Millisecond)
		r, err = s.Reserve(ctx, k, l, 3)
		if err != nil {
			t.Fatal(err)
		}
		if r.N != 3 {
			t.Fatalf("N = %d, want 3", r.N)
		}
		near(t, "slot 0", r.Delay(0), 100*time.Millisecond)
		near(t, "slot 2", r.Delay(2), 200*time.Millisecond)
		// At is the store's now, on its clock: the delays count from it.
		near(t, "At - clock", r.At.Sub(clock.Now()), 0)
		// The drain holds slots up to +200ms: an arrival at +60ms must queue.
		clock.Advance(60 * time.Millisecond)
		if d, err := s.Admit(ctx, k, l); err != nil || d.Allowed {
			t.Fatalf("admit behind a backlog: %+v %v, want refused", d, err)
		}
	})

	t.Run("ReserveOnFullBucketStartsNow", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 1000, Burst: 5}
		r, err := s.Reserve(ctx, k, l, 8)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			near(t, "burst slot", r.Delay(i), 0)
		}
		near(t, "slot 5", r.Delay(5), time.Millisecond)
		near(t, "slot 7", r.Delay(7), 3*time.Millisecond)
	})

	t.Run("FractionalRate", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 0.5, Burst: 1}
		if d, _ := s.Admit(ctx, k, l); !d.Allowed {
			t.Fatal("first job refused")
		}
		d, _ := s.Admit(ctx, k, l)
		if d.Allowed {
			t.Fatal("second job admitted")
		}
		near(t, "RetryAfter", d.RetryAfter, 2*time.Second)
		clock.Advance(2 * time.Second)
		if d, _ := s.Admit(ctx, k, l); !d.Allowed {
			t.Fatal("job after 2s refused")
		}
	})

	t.Run("PeekTakesNothing", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 10, Burst: 3}
		for i := 0; i < 3; i++ {
			d, err := s.Peek(ctx, k, l)
			if err != nil || !d.Allowed || d.Remaining != 3 {
				t.Fatalf("peek %d: %+v %v", i, d, err)
			}
		}
		s.Admit(ctx, k, l)
		if d, _ := s.Peek(ctx, k, l); d.Remaining != 2 {
			t.Fatalf("remaining after one admit = %d, want 2", d.Remaining)
		}
	})

	t.Run("KeysAreIndependent", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 1, Burst: 1}
		for _, key := range []bucket.Key{{Lane: "a"}, {Lane: "b"}, {Lane: "a", Sub: "x"}, {Lane: "a", Sub: "y"}} {
			if d, err := s.Admit(ctx, key, l); err != nil || !d.Allowed {
				t.Fatalf("%v: %+v %v", key, d, err)
			}
			if d, _ := s.Admit(ctx, key, l); d.Allowed {
				t.Fatalf("%v: second job admitted", key)
			}
		}
	})

	t.Run("PauseHoldsEverySlot", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 100, Burst: 10}
		if err := s.Pause(ctx, k, l, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if d, _ := s.Admit(ctx, k, l); d.Allowed {
			t.Fatal("admitted during a pause")
		}
		r, _ := s.Reserve(ctx, k, l, 1)
		near(t, "slot after pause", r.Delay(0), 2*time.Second)
		// A shorter pause later never shortens the longer one.
		s.Pause(ctx, k, l, time.Second)
		r, _ = s.Reserve(ctx, k, l, 1)
		near(t, "next slot", r.Delay(0), 2*time.Second+10*time.Millisecond)
	})

	t.Run("InvalidLimitsNeverReachTheState", func(t *testing.T) {
		clock := NewClock()
		s := newStore(t, clock)
		for _, l := range []bucket.Limit{{Rate: 0, Burst: 1}, {Rate: math.NaN(), Burst: 1}, {Rate: math.Inf(1), Burst: 1}, {Rate: -1, Burst: 1}, {Rate: 1, Burst: 0}} {
			if _, err := s.Admit(ctx, k, l); !errors.Is(err, bucket.ErrInvalidLimit) {
				t.Errorf("Admit(%v) err = %v, want ErrInvalidLimit", l, err)
			}
			if _, err := s.Reserve(ctx, k, l, 1); !errors.Is(err, bucket.ErrInvalidLimit) {
				t.Errorf("Reserve(%v) err = %v, want ErrInvalidLimit", l, err)
			}
		}
		if d, err := s.Admit(ctx, k, bucket.Limit{Rate: 1, Burst: 1}); err != nil || !d.Allowed {
			t.Fatalf("state was touched by invalid limits: %+v %v", d, err)
		}
	})

	t.Run("NoOvershootUnderRandomLoad", func(t *testing.T) {
		// G1: over any window W, starts ≤ burst + rate·W (+ one slot of
		// resolution slack per window edge for coarse stores).
		clock := NewClock()
		s := newStore(t, clock)
		l := bucket.Limit{Rate: 200, Burst: 7}
		rng := rand.New(rand.NewPCG(1, 2))
		start := clock.Now()
		var starts []time.Duration
		for clock.Now().Sub(start) < 3*time.Second {
			clock.Advance(time.Duration(rng.IntN(4000)) * time.Microsecond)
			now := clock.Now().Sub(start)
			if rng.IntN(2) == 0 {
				d, err := s.Admit(ctx, k, l)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					starts = append(starts, now)
				}
				continue
			}
			r, err := s.Reserve(ctx, k, l, 1+rng.IntN(4))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < r.N; i++ {
				starts = append(starts, now+r.Delay(i))
			}
		}
		CheckWindows(t, starts, l, tol)
	})
}

// CheckWindows fails t when the start times (any order) break G1: more than
// burst + rate·W starts in some window of length W. It checks every window
// that begins at a start, for W from one period to the whole span.
func CheckWindows(t testing.TB, starts []time.Duration, l bucket.Limit, tol time.Duration) {
	t.Helper()
	s := append([]time.Duration(nil), starts...)
	slices.Sort(s)
	for i := range s {
		for j := i; j < len(s); j++ {
			w := s[j] - s[i] + tol
			allowed := float64(l.Burst) + l.Rate*w.Seconds()
			if float64(j-i+1) > allowed+1e-9 {
				t.Fatalf("G1 broken: %d starts in window [%v, %v] (W=%v), limit %v allows %.2f", j-i+1, s[i], s[j], w, l, allowed)
			}
		}
	}
}
