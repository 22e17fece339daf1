package lane

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestPauseIsWrittenAtTheSlowedRate: an adaptive lane (10/s burst 5) gets a
// 429 with Retry-After: 1 s. It slows down (5/s) and pauses, and the
// lane's shared state must then hand out no slot of the slowed limit, the
// one its drains reserve at, before the wait ends, and a bucket that
// refills from empty after it (bucket.Pause). Before, the pause was
// written before the slow-down, at the full rate, whose tolerance is
// shorter: the state let a slot start 400 ms before the wait's end (on an
// instance the control message missed) and three at once at its end.
func TestPauseIsWrittenAtTheSlowedRate(t *testing.T) {
	nc, q := laneQueue(t)
	ctx := context.Background()
	clk := buckettest.NewClock() // the store's; the lane runs on real time
	t0 := clk.Now()
	store := &bucket.Memory{Clock: clk}
	var answered atomic.Int64
	target := dispatch.Handler(func(context.Context, dispatch.Job) dispatch.Result {
		defer answered.Add(1)
		return dispatch.Result{Verdict: dispatch.Retry, Status: http.StatusTooManyRequests, RetryAfter: time.Second, PauseLane: time.Second}
	})
	rate, err := bucket.ParseRate("10/s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{Lanes: []config.Lane{{Name: "demo", Rate: rate, Burst: 5, MaxInflight: 1,
		Adaptive: config.Adaptive{Enabled: true, Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: config.Duration(time.Minute)},
		Target:   config.Target{Handler: "h"}}}}
	cfg.ApplyDefaults()
	l, err := New(ctx, cfg.Lanes[0], Deps{Bus: nc, Targets: NATSTargets{Conn: nc}, Queue: q, Store: store,
		Handlers: map[string]dispatch.Target{"h": target}, Metrics: metrics.New(prometheus.NewRegistry()),
		DedupWindow: time.Minute, Instance: "i1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	if _, err := q.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	defer runLane(t, ctx, l, 10*time.Second)()
	testenv.Eventually(t, 10*time.Second, "the 429 to be settled", func() bool {
		return answered.Load() == 1 && l.EffectiveLimit().Rate == 5
	})
	slowed := l.EffectiveLimit()
	key := bucket.Key{Lane: "demo"}
	until := t0.Add(time.Second)
	clk.Advance(until.Sub(clk.Now()) - time.Nanosecond)
	if d, _ := store.Peek(ctx, key, slowed); d.Allowed {
		t.Fatalf("the lane has room at its slowed limit %v before the wait ends (%d jobs)", slowed, d.Remaining)
	}
	clk.Advance(time.Nanosecond)
	if d, _ := store.Peek(ctx, key, slowed); d.Remaining != 1 {
		t.Fatalf("the lane has room for %d jobs at its slowed limit %v when the wait ends, want 1 (an empty bucket)", d.Remaining, slowed)
	}
}
