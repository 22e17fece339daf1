package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// oneLane is a queue on a fresh server with lane "demo" of max_backlog 1.
func oneLane(t *testing.T) *queue.Queue {
	t.Helper()
	q, _ := newBareQueue(t)
	if err := q.EnsureLane(context.Background(), queue.LaneSpec{Name: "demo", MaxBacklog: 1, MaxInflight: 4, Prefetch: 4,
		AckWait: 5 * time.Second, MaxBody: 1024, DedupWindow: time.Minute}); err != nil {
		t.Fatal(err)
	}
	return q
}

// onRead makes the next stream info read run f between JetStream's answer
// and its use, once.
func onRead(t *testing.T, f func()) { t.Cleanup(queue.OnStreamRead(f)) }

// TestBacklogEstimateMissesNoPublish: the backlog estimate admission reads
// (a JetStream count up to 250 ms old plus this instance's publishes since)
// never counts fewer jobs than are stored. A publish confirmed while a
// stream info was on its way used to be dropped from it (the count was
// taken before the job was stored, the publish counter reset after), and a
// read answered late could replace a newer one; both left the estimate a
// job short until the next read.
func TestBacklogEstimateMissesNoPublish(t *testing.T) {
	q := oneLane(t)
	ctx := context.Background()
	publish := func(id string) {
		t.Helper()
		if _, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo"}); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}

	// A job stored while the count of an empty stream comes back.
	onRead(t, func() { publish("during-read") })
	if n, err := q.Backlog(ctx, "demo", 0); err != nil || n != 0 {
		t.Fatalf("fresh backlog %d %v, want JetStream's 0 (the job came after its count)", n, err)
	}
	if n, _ := q.Backlog(ctx, "demo", time.Hour); n != 1 {
		t.Fatalf("estimate %d after a publish confirmed during the read, want 1", n)
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "over", Lane: "demo"}); !errors.Is(err, queue.ErrBacklogFull) {
		t.Fatalf("a second job in a lane of max_backlog 1: %v, want ErrBacklogFull", err)
	}

	// An older read answered after a newer one does not replace it: the
	// stream is emptied, a read starts, and before its answer is used a job
	// is stored and a second read counts it.
	q2 := oneLane(t)
	onRead(t, func() {
		if _, err := q2.Publish(ctx, queue.Job{ID: "late", Lane: "demo"}); err != nil {
			t.Error(err)
		}
		if n, err := q2.Backlog(ctx, "demo", 0); err != nil || n != 1 {
			t.Errorf("the newer read: %d %v, want 1", n, err)
		}
	})
	if n, err := q2.Backlog(ctx, "demo", 0); err != nil || n != 0 {
		t.Fatalf("the older read: %d %v, want 0", n, err)
	}
	if n, _ := q2.Backlog(ctx, "demo", time.Hour); n != 1 {
		t.Fatalf("estimate %d after an older read answered last, want 1", n)
	}
}

// TestJobHeldForAFarSlotStaysCounted: a job the drain has read and holds
// for a slot far away (not acknowledged, kept alive) is still in the
// lane's stream: it counts in the backlog, and the lane at max_backlog
// refuses the next job until it is done.
func TestJobHeldForAFarSlotStaysCounted(t *testing.T) {
	q := oneLane(t)
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "held", Lane: "demo"}); err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs, err := c.Next(ctx, 4)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("fetch: %d jobs, %v", len(msgs), err)
	}
	for _, maxAge := range []time.Duration{0, time.Hour} {
		if n, err := q.Backlog(ctx, "demo", maxAge); err != nil || n != 1 {
			t.Fatalf("backlog (max age %v) with the job held: %d %v, want 1", maxAge, n, err)
		}
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "next", Lane: "demo"}); !errors.Is(err, queue.ErrBacklogFull) {
		t.Fatalf("a job while one is held: %v, want ErrBacklogFull", err)
	}
	if err := msgs[0].Ack(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the done job leaves the backlog", func() bool {
		n, err := q.Backlog(ctx, "demo", 0)
		return err == nil && n == 0
	})
	if _, err := q.Publish(ctx, queue.Job{ID: "next", Lane: "demo"}); err != nil {
		t.Fatalf("a job after the held one is done: %v", err)
	}
}

// TestSharedBacklogReadCountsPublishesSince: a Backlog with maxAge that
// reads JetStream (its count stale) answers with the estimate, not the raw
// count: a job confirmed while the shared stream info was on its way is not
// in that count, and the answer never counts fewer jobs than are stored.
func TestSharedBacklogReadCountsPublishesSince(t *testing.T) {
	q := oneLane(t)
	ctx := context.Background()
	onRead(t, func() {
		if _, err := q.Publish(ctx, queue.Job{ID: "during-read", Lane: "demo"}); err != nil {
			t.Error(err)
		}
	})
	if n, err := q.Backlog(ctx, "demo", time.Hour); err != nil || n != 1 {
		t.Fatalf("backlog after a shared read %d %v, want 1 (the job confirmed during the read)", n, err)
	}
}
