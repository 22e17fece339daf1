package lane

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestStartExpiresOnTheLanesClock: the drain's start reads a job's expiry
// on the lane's injected clock, not the wall clock: a job that expires in
// an hour of wall time, started when the lane's manual clock says two
// hours have passed, is dead-lettered with the reason "expired" instead of
// delivered (the lane here has no target: a delivery would fail the
// test), counted, and its permit is given back.
func TestStartExpiresOnTheLanesClock(t *testing.T) {
	_, q := laneQueue(t)
	ctx := context.Background()
	if err := q.EnsureLane(ctx, queue.LaneSpec{Name: "demo", MaxBacklog: 10, MaxInflight: 2, Prefetch: 1,
		AckWait: 5 * time.Second, MaxBody: 1024, DedupWindow: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wall := time.Now()
	if _, err := q.Publish(ctx, queue.Job{ID: "old", Lane: "demo", Payload: []byte("x"), Expires: wall.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msgs, err := c.Next(fctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	l := &Lane{
		cfg: config.Lane{Name: "demo", Retry: config.Retry{BackoffMax: config.Duration(time.Second)}},
		d:   Deps{Metrics: m, Clock: clock.NewManual(wall.Add(2 * time.Hour)), Queue: q},
		log: slog.New(slog.DiscardHandler), hot: newHotMetrics(m, "demo"),
	}
	done := make(chan struct{})
	l.start(ctx, msgs[0], func() { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the permit of the expired job was not given back")
	}
	dead, err := q.ListDead(ctx, "demo", 0, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != "old" || dead[0].Reason != queue.ReasonExpired {
		t.Fatalf("dead letters %+v (%v), want job old with reason %q", dead, err, queue.ReasonExpired)
	}
	if n := testutil.ToFloat64(m.DeadLettered.WithLabelValues("demo")); n != 1 {
		t.Fatalf("dead-lettered counter %v, want 1", n)
	}
}

// laneQueue connects to a fresh NATS server and makes the queue a lane
// needs: its retry and dead-letter streams.
func laneQueue(t *testing.T) (*nats.Conn, *queue.Queue) {
	t.Helper()
	nc, err := nats.Connect(testenv.StartNATS(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := queue.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := q.EnsureRetries(ctx, queue.RetryConfig{MaxMsgs: 100, MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureDeadLetters(ctx, queue.DeadConfig{MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	return nc, q
}
