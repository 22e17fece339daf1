package keyed_test

import (
	"math"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/keyed"
)

// TestSlowdownSteps: a key's factor halves on a push-back, at most once per
// interval, never below min, climbs back by increase per quiet interval,
// and the key is forgotten once it recovered; other keys stay at 1.
func TestSlowdownSteps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	s := &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.2, Interval: time.Second}
	near := func(t *testing.T, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Fatalf("factor %v, want %v", got, want)
		}
	}
	steps := []struct {
		name    string
		at      time.Duration
		limited bool
		changed bool
		factor  float64
		keys    int
	}{
		{"unknown key", 0, false, false, 1, 0},
		{"first push-back halves", 0, true, true, 0.5, 1},
		{"a second one within the interval counts once", 500 * time.Millisecond, true, false, 0.5, 1},
		{"after the interval halves again", 1400 * time.Millisecond, true, true, 0.25, 1},
		{"never below min", 2500 * time.Millisecond, true, true, 0.2, 1},
		{"still min", 3600 * time.Millisecond, true, true, 0.2, 1},
		{"not yet an interval quiet", 4500 * time.Millisecond, false, false, 0.2, 1},
		{"one quiet interval adds increase", 4600 * time.Millisecond, false, false, 0.3, 1},
		{"three more", 7600 * time.Millisecond, false, false, 0.6, 1},
		{"recovered, capped at 1 and forgotten", 20 * time.Second, false, false, 1, 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.limited {
				f, changed := s.Limited("bad", at(st.at))
				near(t, f, st.factor)
				if changed != st.changed {
					t.Fatalf("changed %v, want %v", changed, st.changed)
				}
			}
			near(t, s.Factor("bad", at(st.at)), st.factor)
			near(t, s.Factor("good", at(st.at)), 1)
			// Read back at 1, a key is forgotten then, not at the next
			// sweep.
			if n := s.Held(); n != st.keys {
				t.Fatalf("%d keys held once read, want %d", n, st.keys)
			}
			if n := s.Sweep(at(st.at)); n != st.keys {
				t.Fatalf("%d keys held, want %d", n, st.keys)
			}
		})
	}
}

// TestSlowdownAdoptAndRecovery: a factor decided elsewhere some time ago is
// taken with its recovery already under way; Recovery is the time back to
// 1, after which nothing is held.
func TestSlowdownAdoptAndRecovery(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.2, Interval: time.Second}
	if got := s.Recovery(0.2); got != 8*time.Second {
		t.Fatalf("Recovery(0.2) = %v, want 8s", got)
	}
	if got := s.Recovery(0.5); got != 5*time.Second {
		t.Fatalf("Recovery(0.5) = %v, want 5s", got)
	}
	for _, f := range []float64{1, 1.5} {
		if got := s.Recovery(f); got != 0 {
			t.Fatalf("Recovery(%v) = %v, want 0", f, got)
		}
	}
	// Decided 2.5 s ago at 0.2: two increases since.
	s.Adopt("k", 0.2, t0.Add(-2500*time.Millisecond), t0)
	if f := s.Factor("k", t0); math.Abs(f-0.4) > 1e-9 {
		t.Fatalf("adopted factor now %v, want 0.4", f)
	}
	// A higher one decided later does not raise it.
	s.Adopt("k", 0.9, t0, t0)
	if f := s.Factor("k", t0); math.Abs(f-0.4) > 1e-9 {
		t.Fatalf("factor %v after adopting a higher one, want 0.4", f)
	}
	// One that has recovered by now is not held at all, not even until
	// the next sweep.
	s.Adopt("old", 0.5, t0.Add(-time.Minute), t0)
	if n := s.Held(); n != 1 {
		t.Fatalf("%d keys held after adopting a recovered factor, want 1 (k)", n)
	}
	if n := s.Sweep(t0); n != 1 {
		t.Fatalf("%d keys held, want 1 (k)", n)
	}
	if n := s.Sweep(t0.Add(6 * time.Second)); n != 0 {
		t.Fatalf("%d keys held after recovery, want 0", n)
	}
	if n := s.Held(); n != 0 {
		t.Fatalf("%d keys held after the sweep that found them recovered, want 0", n)
	}
}

// TestSlowdownSlowsOnlyItsKey: two keys at 20/s under a wide lane cap; the
// downstream of "bad" pushes back on every start for 5 s. On both pacers
// (fake clock) "bad" slows to min (4/s) and recovers to its full rate
// afterwards, while "good" keeps 20/s within 3 % all along.
func TestSlowdownSlowsOnlyItsKey(t *testing.T) {
	pairStores(t, func(t *testing.T, c *clock.Manual, store bucket.PairStore) {
		lane := bucket.Limit{Rate: 1000, Burst: 10}
		keys := map[string]*simKey{
			"bad": {limit: bucket.Limit{Rate: 20, Burst: 1}, backlog: 10_000,
				pushBack: func(at time.Duration) bool { return at < 5*time.Second }},
			"good": {limit: bucket.Limit{Rate: 20, Burst: 1}, backlog: 10_000},
		}
		slow := &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.2, Interval: time.Second}
		starts := simulateSlow(t, c, store, lane, keys, 20*time.Second, slow)
		if r := rateOver(starts["bad"], 3*time.Second, 5*time.Second); math.Abs(r-4) > 0.6 {
			t.Errorf("bad key at %.2f/s while pushed back, want about 4/s (min 0.2 of 20/s)", r)
		}
		if r := rateOver(starts["bad"], 15*time.Second, 20*time.Second); math.Abs(r-20)/20 > 0.03 {
			t.Errorf("bad key at %.2f/s after recovering, want 20/s within 3%%", r)
		}
		for _, w := range [][2]time.Duration{{0, 5 * time.Second}, {5 * time.Second, 20 * time.Second}} {
			if r := rateOver(starts["good"], w[0], w[1]); math.Abs(r-20)/20 > 0.03 {
				t.Errorf("good key at %.2f/s over %v, want 20/s within 3%%", r, w)
			}
		}
	})
}

// TestSlowdownForgetsWhatRecovered: a key read back at its full rate is
// forgotten at once (no memory per recovered key), and a stored factor out
// of (0, 1) is not adopted.
func TestSlowdownForgetsWhatRecovered(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.2, Interval: time.Second}
	s.Limited("k", t0)
	if n := s.Sweep(t0); n != 1 {
		t.Fatalf("%d keys held after a push-back, want 1", n)
	}
	later := t0.Add(s.Recovery(0.5))
	if f := s.Factor("k", later); f != 1 {
		t.Fatalf("factor %v after its recovery, want 1", f)
	}
	// Factor forgot it: a sweep of the same instant finds nothing.
	if n := s.Sweep(t0); n != 0 {
		t.Fatalf("%d keys held once read back at 1, want 0", n)
	}
	for _, f := range []float64{0, 1, -0.5, 1.5} {
		s.Adopt("j", f, t0, t0)
		if got := s.Factor("j", t0); got != 1 {
			t.Fatalf("adopted %v: factor %v, want 1 (not adopted)", f, got)
		}
	}
}
