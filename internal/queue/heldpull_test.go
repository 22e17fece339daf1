package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestJobsOfAnOpenPullAreKeptWhileNotAsked: a drain that stops asking
// (an operator's hold) while its last pull request is still open. Next
// returned job a; the same request then brings b, c and d, which nobody
// asks for while the lane is held for longer than the ack wait. Before,
// they sat in the client's buffer, unread and not kept alive: the server
// delivered them again after the ack wait (here to a probe, as it would to
// another instance, or to this one beside the copies still in the buffer:
// the records bench's drained lane got 32 of its jobs twice after a hold).
// Now every job the request brings is taken in as it arrives and kept
// alive: the probe gets nothing for three ack waits, and Next then hands
// out b, c and d, first deliveries, in order.
func TestJobsOfAnOpenPullAreKeptWhileNotAsked(t *testing.T) {
	const ackWait = time.Second
	s := spec()
	s.MaxBacklog, s.MaxInflight, s.AckWait = 10, 4, ackWait
	q, nc := newQueue(t, s)
	ctx := context.Background()
	publish := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo", Payload: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("a")
	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	c.FetchWait = 5 * ackWait // the request stays open past the publishes below
	keepCtx, stopKeep := context.WithCancel(ctx)
	var keep sync.WaitGroup
	keep.Go(func() { c.KeepAlive(keepCtx) })
	defer func() {
		stopKeep()
		keep.Wait()
		c.Close()
	}()
	first, err := c.Next(ctx, 4)
	if err != nil || len(first) != 1 || first[0].Job().ID != "a" {
		t.Fatalf("first Next: %d jobs, %v; want job a", len(first), err)
	}
	publish("b", "c", "d")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, queue.StreamName("demo"), queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the open request bringing b, c and d", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 4
	})
	// The probe waits three ack waits for any job the server hands out
	// again; all four are pending (max_inflight 4), so only a job whose ack
	// wait ran out can come.
	probe, err := cons.Fetch(1, jetstream.FetchMaxWait(3*ackWait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range probe.Messages() {
		meta, _ := m.Metadata()
		_ = m.Nak()
		t.Fatalf("the server delivered stream seq %d again (delivery %d) while the reader held it", meta.Sequence.Stream, meta.NumDelivered)
	}
	rest, err := c.Next(ctx, 4)
	if err != nil || len(rest) != 3 {
		t.Fatalf("Next after the hold: %d jobs, %v; want b, c, d", len(rest), err)
	}
	for i, m := range append(first, rest...) {
		if want := string(rune('a' + i)); m.Job().ID != want || !m.FirstDelivery() {
			t.Errorf("job %d: %s (first delivery %v), want %s, first delivery", i, m.Job().ID, m.FirstDelivery(), want)
		}
		if err := m.AckSync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ci, err := cons.Info(ctx)
	if err != nil || ci.NumAckPending != 0 || ci.Delivered.Consumer != 4 {
		t.Fatalf("consumer after the acks: %+v %v; want nothing pending, 4 deliveries", ci, err)
	}
}
