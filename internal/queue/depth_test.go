package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestDepthRetriesAndDeadByLane: the reads behind the lanes' backlog,
// oldest-job, retrying and dead-letter gauges, for two lanes at once; and a
// retry keeps its job's first store time.
func TestDepthRetriesAndDeadByLane(t *testing.T) {
	t.Parallel()
	q, _ := newQueue(t, spec())
	ctx := context.Background()
	other := spec()
	other.Name = "other"
	if err := q.EnsureLane(ctx, other); err != nil {
		t.Fatal(err)
	}
	if d, err := q.Depth(ctx, "demo"); err != nil || d.Stored != 0 || !d.Oldest.IsZero() {
		t.Fatalf("empty lane: %+v %v", d, err)
	}
	before := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo", Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := q.Depth(ctx, "demo")
	if err != nil || d.Stored != 3 {
		t.Fatalf("depth %+v %v, want 3 stored", d, err)
	}
	// The in-process server shares this clock.
	if d.Oldest.Before(before.Add(-time.Millisecond)) || d.Oldest.After(time.Now()) {
		t.Fatalf("oldest stored at %v, published after %v", d.Oldest, before)
	}
	if d, _ := q.Depth(ctx, "other"); d.Stored != 0 {
		t.Fatalf("other lane holds %d", d.Stored)
	}

	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got []*queue.Msg
	for len(got) < 2 {
		items, err := c.Next(ctx, 2-len(got))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, items...)
	}
	a, b := got[0], got[1]
	if !a.EnqueuedAt().Equal(a.StoredAt()) {
		t.Fatalf("a first job's enqueued-at %v is not its store time %v", a.EnqueuedAt(), a.StoredAt())
	}
	firstStored := a.StoredAt()
	if err := a.Retry(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Dead(ctx, queue.DeadInfo{Reason: "rejected by target"}, time.Second); err != nil {
		t.Fatal(err)
	}
	retries, err := q.RetriesByLane(ctx)
	if err != nil || retries["demo"] != 1 || retries["other"] != 0 {
		t.Fatalf("retries %v %v", retries, err)
	}
	dead, err := q.DeadByLane(ctx)
	if err != nil || dead["demo"] != 1 || len(dead) != 1 {
		t.Fatalf("dead letters %v %v", dead, err)
	}
	if n, _ := q.CountDead(ctx, "demo"); n != dead["demo"] {
		t.Fatalf("CountDead %d, DeadByLane %d", n, dead["demo"])
	}
	// b left, a's copy waits in the retry stream: c alone is in the lane
	// once the server has applied the two acks (they are not awaited).
	testenv.EventuallyNil(t, 5*time.Second, "c alone in the lane", func() error {
		if d, err := q.Depth(ctx, "demo"); err != nil || d.Stored != 1 {
			return fmt.Errorf("depth after settling: %+v %v", d, err)
		}
		return nil
	})

	// The mover brings a back behind c; its end-to-end time still counts
	// from its first store.
	mctx, stop := context.WithCancel(ctx)
	moved := make(chan struct{})
	go func() { defer close(moved); q.MoveRetries(mctx, "demo", slogDiscard()) }()
	defer func() { stop(); <-moved }()
	var retried *queue.Msg
	for retried == nil {
		items, err := c.Next(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range items {
			if m.Job().ID == "a" {
				retried = m
			}
			m.Ack()
		}
	}
	if retried.Attempt() != 2 || !retried.StoredAt().After(firstStored) {
		t.Fatalf("retry: attempt %d stored %v (first %v)", retried.Attempt(), retried.StoredAt(), firstStored)
	}
	if got, want := retried.EnqueuedAt().UnixMilli(), firstStored.UnixMilli(); got != want {
		t.Fatalf("retry enqueued at %d, first stored at %d (ms)", got, want)
	}
}
