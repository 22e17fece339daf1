package keyed_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/keyed"
)

// TestPacerPausesAKeyAtItsSlowedRate: a key's target answers 429 with
// Retry-After on a lane with per_key.adaptive. The lane slows the key down
// (PushedBack) and pauses it (PauseKey), in that order. The key's shared
// state must then hand out no slot of the key's limit now, the slowed one,
// before the wait ends, and a bucket that refills from empty after it:
// another instance that takes the key over reserves at that limit. Before,
// the pause was written with the key's full-rate limit, whose tolerance is
// shorter: at 10/s burst 5 slowed to 5/s the state let a slot start 400 ms
// before the wait's end, and three at once at its end.
func TestPacerPausesAKeyAtItsSlowedRate(t *testing.T) {
	ctx := context.Background()
	clk := &stillClock{now: t0}
	store := &bucket.Memory{Clock: clk}
	full := bucket.Limit{Rate: 10, Burst: 5}
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: &memReader{}, Pair: store, Pauser: store, Claims: keyed.Local{},
		Adaptive: &keyed.Slowdown{Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: time.Minute},
		Start:    func(context.Context, *memJob, func()) {}, LaneLimit: laneLimit,
		KeyLimit: func(string) bucket.Limit { return full }, KeyOpts: oneEach,
		MaxInflight: 1, MaxPause: time.Minute, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	k.Claim(ctx, "a")
	k.PushedBack(ctx, "a")
	k.PauseKey(ctx, "a", time.Second)
	slowed := k.KeyLimit("a", t0)
	if slowed.Rate != 5 {
		t.Fatalf("a's rate %v after the push-back, want 5", slowed.Rate)
	}
	key := bucket.Key{Lane: "demo", Sub: "a"}
	until := t0.Add(time.Second)
	clk.set(until.Add(-time.Nanosecond))
	if d, _ := store.Peek(ctx, key, slowed); d.Allowed {
		t.Fatalf("a has room at its slowed limit %v before the wait ends (%d jobs)", slowed, d.Remaining)
	}
	clk.set(until)
	if d, _ := store.Peek(ctx, key, slowed); d.Remaining != 1 {
		t.Fatalf("a has room for %d jobs at its slowed limit %v when the wait ends, want 1 (an empty bucket)", d.Remaining, slowed)
	}
}
