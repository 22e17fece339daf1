package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/clock"
)

// TestMemorySweepDropsIdleStates: every sweepEvery operations, and only
// then, the states whose bucket is full again are dropped, so memory stays
// bounded by the busy keys; a busy state stays.
func TestMemorySweepDropsIdleStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := clock.NewManual(time.Unix(1_000_000, 0))
	m := &Memory{Clock: c}
	l := Limit{Rate: 1, Burst: 1}
	idle, busy := Key{Lane: "idle"}, Key{Lane: "busy"}
	states := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.states)
	}
	op := func(k Key) {
		t.Helper()
		if _, err := m.Reserve(ctx, k, l, 1); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		op(idle) // operation 1 of the round: full again in 1 s
		c.Advance(10 * time.Second)
		for range sweepEvery - 2 {
			op(busy) // a slot a second: thousands of seconds of backlog
		}
		if n := states(); n != 2 {
			t.Fatalf("round %d: %d states after %d operations, want 2 (no sweep before %d)", round, n, sweepEvery-1, sweepEvery)
		}
		op(busy)
		if n := states(); n != 1 {
			t.Fatalf("round %d: %d states after %d operations, want 1 (the idle state swept, the busy one kept)", round, n, sweepEvery)
		}
	}
}
