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
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newQueue(t testing.TB, spec queue.LaneSpec) (*queue.Queue, *nats.Conn) {
	t.Helper()
	q, nc := newBareQueue(t)
	ctx := context.Background()
	if err := q.EnsureLane(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second start with the same spec changes nothing.
	if err := q.EnsureLane(ctx, spec); err != nil {
		t.Fatalf("EnsureLane again: %v", err)
	}
	return q, nc
}

// newBareQueue is a queue on a fresh server with its retry and dead-letter
// streams, and no lane yet.
func newBareQueue(t testing.TB) (*queue.Queue, *nats.Conn) {
	t.Helper()
	return bareQueueOn(t, testenv.StartNATS(t).ClientURL())
}

// bareQueueOn is newBareQueue on the server at url.
func bareQueueOn(t testing.TB, url string) (*queue.Queue, *nats.Conn) {
	t.Helper()
	return bareQueueWith(t, url, queue.RetryConfig{MaxMsgs: 1000, MaxBytes: 1 << 20})
}

// bareQueueWith is bareQueueOn with the retry stream of rc.
func bareQueueWith(t testing.TB, url string, rc queue.RetryConfig) (*queue.Queue, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := queue.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := q.EnsureRetries(ctx, rc); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureDeadLetters(ctx, queue.DeadConfig{MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	return q, nc
}

func spec() queue.LaneSpec {
	return queue.LaneSpec{Name: "demo", MaxBacklog: 3, MaxInflight: 2, Prefetch: 1, AckWait: 5 * time.Second,
		MaxBody: 1024, DedupWindow: time.Minute}
}

func TestPublishDedupAndBacklogBound(t *testing.T) {
	q, _ := newQueue(t, spec())
	ctx := context.Background()
	for i, id := range []string{"a", "b", "a"} {
		res, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo", Payload: []byte(id)})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if dup := i == 2; res.Duplicate != dup {
			t.Fatalf("publish %d (%s): duplicate=%v", i, id, res.Duplicate)
		}
	}
	if n, err := q.Backlog(ctx, "demo", 0); err != nil || n != 2 {
		t.Fatalf("backlog %d %v, want 2", n, err)
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "c", Lane: "demo"}); err != nil {
		t.Fatal(err)
	}
	// max_backlog 3 reached: the stream itself refuses, exactly.
	_, err := q.Publish(ctx, queue.Job{ID: "d", Lane: "demo"})
	if !errors.Is(err, queue.ErrBacklogFull) {
		t.Fatalf("4th job: %v, want ErrBacklogFull", err)
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "x", Lane: "nope"}); !errors.Is(err, queue.ErrUnknownLane) {
		t.Fatalf("unknown lane: %v", err)
	}
}

// TestEnsureLaneUpdatesAChangedLane: an upgrade or a config change needs no
// manual step: the stream and consumer take the new limits at start.
func TestEnsureLaneUpdatesAChangedLane(t *testing.T) {
	q, nc := newQueue(t, spec())
	changed := spec()
	changed.MaxBacklog, changed.MaxInflight = 7, 5
	if err := q.EnsureLane(context.Background(), changed); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), queue.StreamName("demo"))
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.MaxMsgs != 7 {
		t.Fatalf("MaxMsgs %d, want 7", st.CachedInfo().Config.MaxMsgs)
	}
	c, err := st.Consumer(context.Background(), queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxAckPending; got != 5 {
		t.Fatalf("MaxAckPending %d, want 5", got)
	}
}

func TestConsumerRetryAndDeadLetters(t *testing.T) {
	t.Parallel()
	q, nc := newQueue(t, spec())
	ctx := context.Background()
	q.Publish(ctx, queue.Job{ID: "j1", Lane: "demo", ContentType: "text/plain", Payload: []byte("one"), Notify: queue.NotifySubject("i1")})
	// A plain core publish without an id gets one from its stream sequence.
	nc.Publish(queue.Subject("demo", ""), []byte("two"))
	nc.Flush()
	c, err := q.Consumer("demo")
	if err != nil {
		t.Fatal(err)
	}
	items, err := c.Next(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for len(items) < 2 {
		more, err := c.Next(ctx, 2-len(items))
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, more...)
	}
	m1, m2 := items[0], items[1]
	if j := m1.Job(); j.ID != "j1" || j.ContentType != "text/plain" || string(j.Payload) != "one" || j.Notify != "throttler.notify.i1" || m1.Attempt() != 1 || !m1.FirstDelivery() {
		t.Fatalf("first job %+v attempt=%d", j, m1.Attempt())
	}
	if j := m2.Job(); j.ID != "demo-2" || j.Notify != "" {
		t.Fatalf("second job %+v", j)
	}
	// j1 fails: its copy waits in the retry stream, not in the lane.
	if err := m1.Retry(ctx, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The server counts a consumer's pending messages once the consumer
	// took the stored one in (its own goroutine): polled, not read once.
	waitForCond(t, "the retry counted as waiting", func() bool {
		n, _ := q.RetriesWaiting(ctx, "demo")
		return n == 1
	})
	// demo-2 is refused for good: a dead letter with its reason.
	if err := m2.Dead(ctx, queue.DeadInfo{Reason: "rejected by target", LastStatus: 404, LastError: "gone"}, time.Second); err != nil {
		t.Fatal(err)
	}
	dead, err := q.ListDead(ctx, "demo", 0, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != "demo-2" || dead[0].LastStatus != 404 || dead[0].Attempts != 1 {
		t.Fatalf("dead letters %+v %v", dead, err)
	}
	// The mover puts the due retry back into the lane; it comes as attempt 2,
	// no longer admitted, with the same id.
	mctx, stop := context.WithCancel(ctx)
	moved := make(chan struct{})
	go func() { defer close(moved); q.MoveRetries(mctx, "demo", slogDiscard()) }()
	next, err := c.Next(ctx, 1)
	stop()
	<-moved
	if err != nil || len(next) != 1 {
		t.Fatalf("retry: %v %v", next, err)
	}
	r := next[0]
	if r.Job().ID != "j1" || r.Attempt() != 2 || r.Job().Notify != "" {
		t.Fatalf("retry came as %+v attempt %d", r.Job(), r.Attempt())
	}
	r.Ack()
	// Replay the dead letter: back in the lane, dead letter gone.
	if _, err := q.ReplayDead(ctx, "demo", dead[0].Seq, queue.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	next, err = c.Next(ctx, 1)
	if err != nil || next[0].Job().ID != "demo-2" || string(next[0].Job().Payload) != "two" {
		t.Fatalf("replayed: %v %v", next, err)
	}
	next[0].Ack()
	if n, _ := q.CountDead(ctx, "demo"); n != 0 {
		t.Fatalf("%d dead letters after replay", n)
	}
	if _, err := q.GetDead(ctx, "demo", dead[0].Seq); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("replayed dead letter still there: %v", err)
	}
	c.Close()
}
