package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
)

// Internal message ids are per lane and per event: the retry and
// dead-letter streams are shared by every lane, and a job id is only unique
// within its lane.

// lanesOn sets up plain lanes with names on a fresh server.
func lanesOn(t *testing.T, names ...string) (*queue.Queue, *nats.Conn) {
	t.Helper()
	q, nc := newBareQueue(t)
	for _, name := range names {
		s := spec()
		s.Name = name
		if err := q.EnsureLane(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	return q, nc
}

// moveRetries runs the retry movers of lanes until the test ends.
func moveRetries(t *testing.T, q *queue.Queue, lanes ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, len(lanes))
	for _, lane := range lanes {
		go func() { q.MoveRetries(ctx, lane, slogDiscard()); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range lanes {
			<-done
		}
	})
}

// nextJob fetches lane's next job through c, failing the test when none
// comes within 10s: a job that vanished.
func nextJob(t *testing.T, c *queue.Consumer, what string) *queue.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ms, err := c.Next(ctx, 1)
	if err != nil {
		t.Fatalf("%s: no job within 10s (%v): it vanished", what, err)
	}
	return ms[0]
}

func consumer(t *testing.T, q *queue.Queue, lane string) *queue.Consumer {
	t.Helper()
	c, err := q.Consumer(lane)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestSameIDOnTwoFailingLanes: the same Idempotency-Key on two lanes whose
// targets fail. Both jobs are retried to their last attempt and both are
// dead-lettered: the second lane's retry copy is not taken for the first's.
func TestSameIDOnTwoFailingLanes(t *testing.T) {
	q, _ := lanesOn(t, "a", "b")
	ctx := context.Background()
	lanes := []string{"a", "b"}
	cs := map[string]*queue.Consumer{}
	for _, lane := range lanes {
		if _, err := q.Publish(ctx, queue.Job{ID: "order-1", Lane: lane, Payload: []byte(lane)}); err != nil {
			t.Fatal(err)
		}
		cs[lane] = consumer(t, q, lane)
	}
	moveRetries(t, q, lanes...)
	const maxAttempts = 3
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		for _, lane := range lanes {
			m := nextJob(t, cs[lane], fmt.Sprintf("lane %s attempt %d", lane, attempt))
			if m.Job().ID != "order-1" || m.Attempt() != attempt || string(m.Job().Payload) != lane {
				t.Fatalf("lane %s: got job %s attempt %d payload %q, want order-1 attempt %d payload %q",
					lane, m.Job().ID, m.Attempt(), m.Job().Payload, attempt, lane)
			}
			var err error
			if attempt < maxAttempts {
				err = m.Retry(ctx, 0)
			} else {
				err = m.Dead(ctx, queue.DeadInfo{Reason: "failed 3 attempts"}, time.Second)
			}
			if err != nil {
				t.Fatalf("lane %s attempt %d: %v", lane, attempt, err)
			}
		}
	}
	for _, lane := range lanes {
		dead, err := q.ListDead(ctx, lane, 0, 10)
		if err != nil || len(dead) != 1 || dead[0].ID != "order-1" || dead[0].Attempts != maxAttempts {
			t.Fatalf("lane %s dead letters %+v (%v), want order-1 after %d attempts", lane, dead, err, maxAttempts)
		}
	}
}

// TestReplayRightAfterAFailureIsDelivered: a job fails once, then for
// good, is replayed and fails once more, all within the retry stream's
// duplicate window. Its second first-attempt retry is a new event, not a
// duplicate of the first: it comes back.
func TestReplayRightAfterAFailureIsDelivered(t *testing.T) {
	q, _ := lanesOn(t, "demo")
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "r", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c := consumer(t, q, "demo")
	moveRetries(t, q, "demo")
	if err := nextJob(t, c, "first delivery").Retry(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := nextJob(t, c, "the retry").Dead(ctx, queue.DeadInfo{Reason: "rejected by target"}, time.Second); err != nil {
		t.Fatal(err)
	}
	dead, err := q.ListDead(ctx, "demo", 0, 1)
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %+v (%v)", dead, err)
	}
	if _, err := q.ReplayDead(ctx, "demo", dead[0].Seq, queue.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	m := nextJob(t, c, "the replay")
	if m.Job().ID != "r" || m.Attempt() != 1 {
		t.Fatalf("replay came as %s attempt %d", m.Job().ID, m.Attempt())
	}
	if err := m.Retry(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if m := nextJob(t, c, "the replay's retry"); m.Job().ID != "r" || m.Attempt() != 2 {
		t.Fatalf("replay's retry came as %s attempt %d", m.Job().ID, m.Attempt())
	} else {
		_ = m.Ack()
	}
}

// TestTwoLanesDeadAtTheSameSequence: two lanes dead-letter a job each at
// the same stream sequence, with the same job id: two dead letters.
func TestTwoLanesDeadAtTheSameSequence(t *testing.T) {
	q, _ := lanesOn(t, "a", "b")
	ctx := context.Background()
	for _, lane := range []string{"a", "b"} {
		if _, err := q.Publish(ctx, queue.Job{ID: "same", Lane: lane, Payload: []byte(lane)}); err != nil {
			t.Fatal(err)
		}
		m := nextJob(t, consumer(t, q, lane), "lane "+lane)
		if m.Seq() != 1 {
			t.Fatalf("lane %s job at seq %d, want 1", lane, m.Seq())
		}
		if err := m.Dead(ctx, queue.DeadInfo{Reason: "rejected by target"}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, lane := range []string{"a", "b"} {
		dead, err := q.ListDead(ctx, lane, 0, 10)
		if err != nil || len(dead) != 1 || dead[0].ID != "same" {
			t.Fatalf("lane %s dead letters %+v (%v), want job same", lane, dead, err)
		}
		if got, _ := q.GetDead(ctx, lane, dead[0].Seq); string(got.Payload) != lane {
			t.Fatalf("lane %s dead letter holds %q, want %q", lane, got.Payload, lane)
		}
	}
}

// TestForgedDuplicateKeepsTheOriginal: a message that holds the id of a
// retry copy or dead letter, but is another job, is stored before the
// throttler's write. The "duplicate" answer is not believed: the write
// fails and the original stays, delivered again.
func TestForgedDuplicateKeepsTheOriginal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		subject string
		msgID   func(*queue.Msg) string
		settle  func(*queue.Msg) error
	}{
		{"retry", queue.RetrySubject("demo"), queue.RetryMsgID,
			func(m *queue.Msg) error { return m.Retry(context.Background(), 10*time.Millisecond) }},
		{"dead letter", queue.DeadSubject("demo"), queue.DeadMsgID,
			func(m *queue.Msg) error {
				return m.Dead(context.Background(), queue.DeadInfo{Reason: "rejected by target"}, 10*time.Millisecond)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, nc := lanesOn(t, "demo")
			ctx := context.Background()
			if _, err := q.Publish(ctx, queue.Job{ID: "victim", Lane: "demo", Payload: []byte("real")}); err != nil {
				t.Fatal(err)
			}
			c := consumer(t, q, "demo")
			m := nextJob(t, c, "the job")
			forged := nats.NewMsg(tc.subject)
			forged.Data = []byte("forged")
			forged.Header.Set(queue.HeaderJobID, "other")
			forged.Header.Set(jetstream.MsgIDHeader, tc.msgID(m))
			js, _ := jetstream.New(nc)
			if _, err := js.PublishMsg(ctx, forged); err != nil {
				t.Fatal(err)
			}
			if err := tc.settle(m); !errors.Is(err, queue.ErrNotTheCopy) {
				t.Fatalf("settle answered %v, want ErrNotTheCopy", err)
			}
			again := nextJob(t, c, "the original again")
			if again.Job().ID != "victim" || again.Seq() != m.Seq() || string(again.Job().Payload) != "real" {
				t.Fatalf("got %s at seq %d, want the original victim at seq %d", again.Job().ID, again.Seq(), m.Seq())
			}
			_ = again.Ack()
		})
	}
}

// TestSameIDOnTwoKeyedLanes: keyed lanes read by key share the retry and
// dead-letter streams too. The same job id at the same sequence of two
// keyed lanes gets a retry copy each, then a dead letter each.
func TestSameIDOnTwoKeyedLanes(t *testing.T) {
	q, _ := newBareQueue(t)
	ctx := context.Background()
	lanes := []string{"a", "b"}
	for _, lane := range lanes {
		s := intakeSpec(100)
		s.Name = lane
		if err := q.EnsureKeyedLane(ctx, s); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Publish(ctx, queue.Job{ID: "same", Lane: lane, Key: "k", Payload: []byte(lane)}); err != nil {
			t.Fatal(err)
		}
	}
	next := func(lane string) *queue.Msg {
		t.Helper()
		r, err := q.KeyedReader(lane)
		if err != nil {
			t.Fatal(err)
		}
		var m *queue.Msg
		waitForCond(t, "lane "+lane+"'s job on key k", func() bool {
			m, err = r.Next(ctx, "k", 1)
			return err == nil && m != nil
		})
		return m
	}
	for _, lane := range lanes {
		if err := next(lane).Retry(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, lane := range lanes {
		waitForCond(t, "lane "+lane+"'s retry waiting", func() bool {
			n, _ := q.RetriesWaiting(ctx, lane)
			return n == 1
		})
		if _, err := q.Publish(ctx, queue.Job{ID: "other", Lane: lane, Key: "k", Payload: []byte(lane)}); err != nil {
			t.Fatal(err)
		}
	}
	// The lanes' second jobs sit at the same sequence (2) of each stream.
	for _, lane := range lanes {
		if err := next(lane).Dead(ctx, queue.DeadInfo{Reason: "rejected by target"}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, lane := range lanes {
		dead, err := q.ListDead(ctx, lane, 0, 10)
		if err != nil || len(dead) != 1 || dead[0].ID != "other" {
			t.Fatalf("lane %s dead letters %+v (%v), want job other", lane, dead, err)
		}
	}
}
