package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// inPlaceInstance is one instance of a fleet whose retry stream is full.
func inPlaceInstance(t *testing.T, url string) (*queue.Queue, *queue.Consumer) {
	t.Helper()
	q, _ := bareQueueWith(t, url, queue.RetryConfig{MaxMsgs: 1, MaxBytes: 1 << 20})
	if err := q.EnsureLane(context.Background(), spec()); err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	c.FetchWait = 100 * time.Millisecond
	return q, c
}

// deliverFailing hands the next job c gets to a target that always fails,
// settled as a lane with max_attempts 3 does: dead-lettered at its third
// attempt, else retried (in place, the retry stream being full). It
// returns the attempt the delivery carried.
func deliverFailing(t *testing.T, c *queue.Consumer) int {
	t.Helper()
	ctx := context.Background()
	next, err := c.Next(ctx, 1)
	if err != nil || len(next) != 1 || next[0].Job().ID != "j1" {
		t.Fatalf("next: %v %v", next, err)
	}
	m := next[0]
	if m.Attempt() >= 3 {
		if err := m.Dead(ctx, queue.DeadInfo{Reason: "failed 3 attempts"}, time.Second); err != nil {
			t.Fatal(err)
		}
		return m.Attempt()
	}
	if err := m.Retry(ctx, 20*time.Millisecond); !errors.Is(err, queue.ErrBacklogFull) {
		t.Fatalf("retry with the retry stream full: %v, want ErrBacklogFull", err)
	}
	return m.Attempt()
}

// TestRetryInPlaceCountsAcrossInstances: a job that waits in place (the
// retry stream is full) and fails on one instance, then on another, then
// on an instance started afresh, is dead-lettered after exactly
// max_attempts (3) attempts in all: each delivery carries the attempts
// every instance made before it. Its count then leaves the tries bucket.
func TestRetryInPlaceCountsAcrossInstances(t *testing.T) {
	url := testenv.StartNATS(t).ClientURL()
	qa, a := inPlaceInstance(t, url)
	_, b := inPlaceInstance(t, url)
	ctx := context.Background()
	if _, err := qa.Schedule(ctx, queue.Job{ID: "later", Lane: "demo", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	var got []int
	got = append(got, deliverFailing(t, a))
	a.Close() // it stops pulling: the job goes to b
	got = append(got, deliverFailing(t, b))
	b.Close()
	// A restart: a new instance, knowing nothing of the job.
	_, c := inPlaceInstance(t, url)
	defer c.Close()
	got = append(got, deliverFailing(t, c))
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("attempts delivered %v, want [1 2 3]", got)
	}
	dead, err := qa.ListDead(ctx, "demo", 0, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != "j1" || dead[0].Attempts != 3 {
		t.Fatalf("dead letters %+v %v", dead, err)
	}
	js, _ := jetstream.New(connect(t, url))
	waitForCond(t, "the tries bucket empty once the job was dead-lettered", func() bool {
		n, _ := streamMsgs(t, js, "KV_"+queue.TriesBucket)
		return n == 0
	})
}

// TestRetryInPlaceBucketUnreachable: with the tries bucket gone, a job
// waiting in place is still counted, by the instance alone, and
// dead-lettered at max_attempts; nothing waits on the bucket.
func TestRetryInPlaceBucketUnreachable(t *testing.T) {
	url := testenv.StartNATS(t).ClientURL()
	q, c := inPlaceInstance(t, url)
	defer c.Close()
	ctx := context.Background()
	js, _ := jetstream.New(connect(t, url))
	if err := js.DeleteKeyValue(ctx, queue.TriesBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Schedule(ctx, queue.Job{ID: "later", Lane: "demo", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		if got := deliverFailing(t, c); got != want {
			t.Fatalf("delivery %d carried attempt %d", want, got)
		}
	}
	dead, err := q.ListDead(ctx, "demo", 0, 10)
	if err != nil || len(dead) != 1 || dead[0].Attempts != 3 {
		t.Fatalf("dead letters %+v %v", dead, err)
	}
}

// TestRedeliveryHereReadsTriesOnce: a job handed back again and again to
// the same instance (a target's rate limit) reads the tries bucket at its
// first redelivery only: from then on this instance had every delivery,
// so no other instance can have counted an attempt.
func TestRedeliveryHereReadsTriesOnce(t *testing.T) {
	url := testenv.StartNATS(t).ClientURL()
	q, c := inPlaceInstance(t, url)
	defer c.Close()
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		next, err := c.Next(ctx, 1)
		if err != nil || len(next) != 1 {
			t.Fatalf("next: %v %v", next, err)
		}
		if i == 4 {
			if err := next[0].Ack(); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := next[0].Wait(10 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if n := queue.TriesReads(c); n != 1 {
		t.Fatalf("tries bucket read %d times, want 1", n)
	}
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestTriesOfARecreatedStreamNotCounted: a count left in the tries bucket
// by a job of a lane stream that was deleted (an operator's nats stream
// rm, the switch between keyed and plain) is not the count of the job the
// re-created stream stores at the same sequence: its first redelivery
// carries its own attempts only.
func TestTriesOfARecreatedStreamNotCounted(t *testing.T) {
	url := testenv.StartNATS(t).ClientURL()
	qa, a := inPlaceInstance(t, url)
	ctx := context.Background()
	if _, err := qa.Schedule(ctx, queue.Job{ID: "later", Lane: "demo", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	first, err := qa.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	deliverFailing(t, a)
	deliverFailing(t, a) // two failed attempts counted in the bucket
	a.Close()
	js, _ := jetstream.New(connect(t, url))
	if err := js.DeleteStream(ctx, queue.StreamName("demo")); err != nil {
		t.Fatal(err)
	}
	qb, b := inPlaceInstance(t, url)
	defer b.Close()
	res, err := qb.Publish(ctx, queue.Job{ID: "j2", Lane: "demo", Payload: []byte("y")})
	if err != nil || res.Seq != first.Seq {
		t.Fatalf("publish in the re-created stream: %+v %v; want sequence %d", res, err, first.Seq)
	}
	for delivery := 1; delivery <= 2; delivery++ {
		next, err := b.Next(ctx, 1)
		if err != nil || len(next) != 1 || next[0].Job().ID != "j2" {
			t.Fatalf("next: %v %v", next, err)
		}
		if got := next[0].Attempt(); got != 1 {
			t.Fatalf("delivery %d of a job never tried carried attempt %d, want 1", delivery, got)
		}
		if err := next[0].Wait(10 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}
