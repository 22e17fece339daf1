package leaky_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/leaky"
)

func TestAIMD(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &leaky.AIMD{Decrease: 0.5, Increase: 0.1, Min: 0.2, Interval: 5 * time.Second}
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	steps := []struct {
		at      float64
		op      string // "factor", "limited", "adopt"
		arg     float64
		want    float64
		changed bool
	}{
		{0, "factor", 0, 1, false},
		{1, "limited", 0, 0.5, true},
		{2, "limited", 0, 0.5, false}, // same burst of 429s: counted once
		{6, "limited", 0, 0.25, true},
		{11, "factor", 0, 0.35, false}, // one interval after: +0.1
		{21, "factor", 0, 0.55, false}, // two more
		{22, "adopt", 0.3, 0.3, false}, // a peer decided lower
		{23, "adopt", 0.9, 0.3, false}, // higher is ignored
		{28, "limited", 0, 0.2, true},  // floor at Min
		{100, "factor", 0, 1, false},   // never above the configured rate
	}
	for i, st := range steps {
		var got float64
		var changed bool
		switch st.op {
		case "factor":
			got = a.Factor(at(st.at))
		case "limited":
			got, changed = a.Limited(at(st.at))
		case "adopt":
			a.Adopt(st.arg, at(st.at))
			got = a.Factor(at(st.at))
		}
		if d := got - st.want; d > 1e-9 || d < -1e-9 || changed != st.changed {
			t.Fatalf("step %d (%s at %vs): factor %v changed %v, want %v %v", i, st.op, st.at, got, changed, st.want, st.changed)
		}
	}
}

// TestAIMDAdoptOlder: a lower factor decided before this instance's last
// decrease never moves that decrease back: the next rate-limit answer
// within Interval of it is still the same burst, and the increase steps
// count from it, not from the older decision.
func TestAIMDAdoptOlder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	a := &leaky.AIMD{Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: 5 * time.Second}
	a.Factor(at(0))
	if f, ok := a.Limited(at(10)); !ok || f != 0.5 {
		t.Fatalf("limited at 10s: %v %v", f, ok)
	}
	// A peer's 0.3, decided at 7 s, arrives late.
	if !a.Adopt(0.3, at(7)) {
		t.Fatal("a lower factor was not adopted")
	}
	// 13 s is within Interval of this instance's decrease at 10 s (not of
	// 7 s): the same burst, no further cut.
	if f, ok := a.Limited(at(13)); ok || f != 0.3 {
		t.Fatalf("limited at 13s: %v changed %v; want 0.3, unchanged", f, ok)
	}
	// The last step is at 13 s (the answer postponed it): no increase
	// before 18 s, even though 7 s + 2 intervals has passed at 17.5 s.
	if f := a.Factor(at(17.5)); f != 0.3 {
		t.Fatalf("factor at 17.5s: %v, want 0.3", f)
	}
	if f := a.Factor(at(18)); f < 0.4-1e-9 || f > 0.4+1e-9 {
		t.Fatalf("factor at 18s: %v, want 0.4", f)
	}
}

// TestDrainHonoursPause: a pause that begins after slots were reserved stops
// every start inside it; the jobs start after it on fresh slots, in order.
func TestDrainHonoursPause(t *testing.T) {
	clock := buckettest.NewClock()
	t0 := clock.Now()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	src := &sliceSource{items: items(6), cancel: cancel}
	l := bucket.Limit{Rate: 10, Burst: 1}
	pauseFrom, pauseTo := t0.Add(250*time.Millisecond), t0.Add(1250*time.Millisecond)
	var starts []start
	d, _ := leaky.New(leaky.Config[item]{
		Source: src, MaxInflight: 4, Batch: 4, Clock: clock,
		Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clock}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		PausedUntil: func() time.Time {
			if now := clock.Now(); !now.Before(pauseFrom) && now.Before(pauseTo) {
				return pauseTo
			}
			return time.Time{}
		},
		Start: func(_ context.Context, it item, done func()) {
			starts = append(starts, start{it.n, clock.Now().Sub(t0)})
			done()
			src.started()
		},
	})
	d.Run(ctx)
	if len(starts) != 6 {
		t.Fatalf("%d starts", len(starts))
	}
	for i, s := range starts {
		if s.n != i {
			t.Fatalf("start %d is job %d: order broken", i, s.n)
		}
		if s.at >= 250*time.Millisecond && s.at < 1250*time.Millisecond {
			t.Fatalf("job %d started at %v, inside the pause", s.n, s.at)
		}
	}
}
