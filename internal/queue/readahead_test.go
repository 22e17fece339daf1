package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestAheadCountsReadAheadAcrossInstances: jobs a drain fetched and has
// not given a slot are ahead of a new job, on the instance that fetched
// them (exact) and on another instance (as shared over NATS); a slot or a
// settle takes a job out of the count, and an instance that stops sharing
// takes its count with it.
func TestAheadCountsReadAheadAcrossInstances(t *testing.T) {
	s := spec()
	s.MaxBacklog, s.MaxInflight = 100, 10
	q1, nc := newQueue(t, s)
	q2, _ := bareQueueOn(t, nc.ConnectedUrl())
	ctx := context.Background()
	if err := q2.EnsureLane(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := q1.Publish(ctx, queue.Job{ID: id, Lane: "demo", Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	c := consumer(t, q1, "demo")
	var got []*queue.Msg
	for len(got) < 3 {
		ms, err := c.Next(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ms...)
	}
	shareCtx, stopShare := context.WithCancel(ctx)
	shared := make(chan struct{})
	go func() { defer close(shared); q1.ShareReadAhead(shareCtx, "demo", c) }()
	t.Cleanup(func() { stopShare(); <-shared })
	// A share of q2's own, so that it hears q1's counts.
	c2 := consumer(t, q2, "demo")
	ctx2, stop2 := context.WithCancel(ctx)
	done2 := make(chan struct{})
	go func() { defer close(done2); q2.ShareReadAhead(ctx2, "demo", c2) }()
	t.Cleanup(func() { stop2(); <-done2 })

	res, err := q1.Publish(ctx, queue.Job{ID: "new", Lane: "demo", Payload: []byte("n")})
	if err != nil {
		t.Fatal(err)
	}
	ahead := func(q *queue.Queue) int64 {
		n, err := q.Ahead(ctx, "demo", "", res.Seq, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := ahead(q1); n != 3 || c.ReadAhead() != 3 {
		t.Fatalf("q1: %d ahead (read ahead %d), want the 3 fetched jobs without a slot", n, c.ReadAhead())
	}
	testenv.Eventually(t, 5*time.Second, "q2 counting q1's read-ahead", func() bool { return ahead(q2) == 3 })
	// Other instances' counts: what they heard; malformed ones are ignored.
	for _, bad := range []string{`{"v":2,"id":"x","n":5}`, `{"v":1,"id":"","n":5}`, `{"v":1,"id":"x","n":-1}`, `not json`} {
		if err := nc.Publish(queue.ReadAheadSubject("demo"), []byte(bad)); err != nil {
			t.Fatal(err)
		}
	}
	// A good count after them on the same connection: once q2 heard it,
	// it had read the bad ones (NATS keeps one publisher's order).
	probe := func(n int) {
		if err := nc.Publish(queue.ReadAheadSubject("demo"), []byte(fmt.Sprintf(`{"v":1,"id":"probe","n":%d}`, n))); err != nil {
			t.Fatal(err)
		}
	}
	probe(7)
	testenv.Eventually(t, 5*time.Second, "q2 hearing the probe", func() bool { return ahead(q2) != 3 })
	if n := ahead(q2); n != 10 {
		t.Fatalf("q2: %d ahead with q1's 3 and the probe's 7: a malformed count was believed", n)
	}
	probe(0)
	testenv.Eventually(t, 5*time.Second, "q2 dropping the probe", func() bool { return ahead(q2) == 3 })
	got[0].Slotted()
	got[0].Slotted() // twice counts once
	_ = got[1].Ack()
	if n := ahead(q1); n != 1 {
		t.Fatalf("q1: %d ahead after a slot and a settle, want the one job still read ahead", n)
	}
	stopShare()
	<-shared
	testenv.Eventually(t, 5*time.Second, "q2 dropping q1's count once it stopped sharing", func() bool { return ahead(q2) == 0 })
	_ = got[0].Ack()
	_ = got[2].Ack()
}
