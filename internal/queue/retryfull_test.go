package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// fullRetryQueue is a queue whose retry stream holds one message and is
// full: a delayed job due in an hour waits in it.
func fullRetryQueue(t *testing.T) *queue.Queue {
	t.Helper()
	q, _ := bareQueueWith(t, testenv.StartNATS(t).ClientURL(), queue.RetryConfig{MaxMsgs: 1, MaxBytes: 1 << 20})
	ctx := context.Background()
	if err := q.EnsureLane(ctx, spec()); err != nil {
		t.Fatal(err)
	}
	s := spec()
	s.Name = "hooks"
	if err := q.EnsureKeyedLane(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Schedule(ctx, queue.Job{ID: "later", Lane: "demo", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return q
}

// failInPlace fails three deliveries of job j1, which next delivers: the
// first two with a retry the full retry stream refuses (the job waits in
// place), the last, its max_attempts of 3, with a dead letter. Each
// delivery must carry one more attempt than the one before: the failed
// attempts of a job waiting in place still count, so that the lane's
// max_attempts is reached and the job dead-lettered, instead of the target
// getting it again and again as its first attempt while the stream stays
// full.
func failInPlace(t *testing.T, q *queue.Queue, lane string, next func() *queue.Msg) {
	t.Helper()
	ctx := context.Background()
	for want := 1; want <= 3; want++ {
		m := next()
		if m.Job().ID != "j1" || m.Attempt() != want {
			t.Fatalf("delivery %d: job %s as attempt %d, want attempt %d", want, m.Job().ID, m.Attempt(), want)
		}
		if want == 3 {
			if err := m.Dead(ctx, queue.DeadInfo{Reason: "failed 3 attempts"}, time.Second); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := m.Retry(ctx, 20*time.Millisecond); !errors.Is(err, queue.ErrBacklogFull) {
			t.Fatalf("retry %d with the retry stream full: %v, want ErrBacklogFull", want, err)
		}
	}
	dead, err := q.ListDead(ctx, lane, 0, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != "j1" || dead[0].Attempts != 3 {
		t.Fatalf("dead letters %+v %v", dead, err)
	}
}

func TestRetryInPlaceCountsAttempts(t *testing.T) {
	q := fullRetryQueue(t)
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	failInPlace(t, q, "demo", func() *queue.Msg {
		next, err := c.Next(ctx, 1)
		if err != nil || len(next) != 1 {
			t.Fatalf("next: %v %v", next, err)
		}
		return next[0]
	})
}

// TestKeyedRetryInPlaceCountsAttempts: the same on a keyed lane, whose
// job waiting in place is read again by its key.
func TestKeyedRetryInPlaceCountsAttempts(t *testing.T) {
	q := fullRetryQueue(t)
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "j1", Lane: "hooks", Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	r, err := q.KeyedReader("hooks")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	failInPlace(t, q, "hooks", func() *queue.Msg {
		m, err := r.Next(ctx, "k", 1)
		if err != nil || m == nil {
			t.Fatalf("next: %v %v", m, err)
		}
		return m
	})
}
