package queue_test

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// keyedDedupLane is a keyed lane whose dropped duplicates are counted.
func keyedDedupLane(t *testing.T) (*queue.Queue, jetstream.JetStream, *atomic.Int64) {
	t.Helper()
	q, js := keyedQueue(t)
	var dropped atomic.Int64
	q.OnDuplicate("demo", func() { dropped.Add(1) })
	return q, js, &dropped
}

// httpJob is the job id on key k of lane demo as a submission over HTTP
// stores it.
func httpJob(id string) queue.Job {
	return queue.Job{ID: id, Lane: "demo", Key: "k", Payload: []byte("http")}
}

// wantXThenAfterOnce drains key k and checks that its jobs were x, then
// after, each stored once, and that OnDuplicate heard wantDropped jobs.
func wantXThenAfterOnce(t *testing.T, q *queue.Queue, dropped *atomic.Int64, wantDropped int64) {
	t.Helper()
	if got := drainKeys(t, q, []string{"k"}, 2)["k"]; !slices.Equal(got, []string{"x", "after"}) {
		t.Fatalf("key k's jobs %v, want [x after]", got)
	}
	if n := laneStored(t, q); n != 0 {
		t.Fatalf("the lane holds %d jobs after the drain, want 0 (x stored twice)", n)
	}
	if n := dropped.Load(); n != wantDropped {
		t.Errorf("OnDuplicate heard %d jobs, want %d", n, wantDropped)
	}
}

func intakeEmpty(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the public jobs moved", func() bool {
		return msgsIn(t, js, queue.IntakeStreamName("demo")) == 0
	})
}

// TestKeyedIntakeNATSJobDuplicateOfHTTPJob: a job published over NATS
// whose Nats-Msg-Id is the Idempotency-Key of a job submitted over HTTP
// and waiting in the lane is dropped when it is moved in: the key's jobs
// are the HTTP job, then the next public one, each once.
func TestKeyedIntakeNATSJobDuplicateOfHTTPJob(t *testing.T) {
	q, js, dropped := keyedDedupLane(t)
	if res, err := q.Publish(context.Background(), httpJob("x")); err != nil || res.Duplicate {
		t.Fatalf("publish x over HTTP: %+v %v", res, err)
	}
	publishPublic(t, js, "k", "x")
	publishPublic(t, js, "k", "after")
	runIntake(t, q)
	intakeEmpty(t, js)
	wantXThenAfterOnce(t, q, dropped, 1)
}

// TestKeyedIntakeHTTPJobDuplicateOfNATSJob: a job submitted over HTTP with
// the Nats-Msg-Id of a job published over NATS and moved into the lane is
// a duplicate, as on a plain lane.
func TestKeyedIntakeHTTPJobDuplicateOfNATSJob(t *testing.T) {
	q, js, dropped := keyedDedupLane(t)
	publishPublic(t, js, "k", "x")
	runIntake(t, q)
	intakeEmpty(t, js)
	if res, err := q.Publish(context.Background(), httpJob("x")); err != nil || !res.Duplicate {
		t.Fatalf("publish x over HTTP after x over NATS: %+v %v, want a duplicate", res, err)
	}
	publishPublic(t, js, "k", "after")
	intakeEmpty(t, js)
	wantXThenAfterOnce(t, q, dropped, 0)
}

// TestKeyedIntakeDelayedDuplicates: a delayed job published over NATS
// claims its id in the lane as a delayed HTTP job does: one whose id an
// HTTP job in the lane holds is dropped (its copy leaves the retry stream),
// and an HTTP job of a delayed public job's id is a duplicate.
func TestKeyedIntakeDelayedDuplicates(t *testing.T) {
	q, js, dropped := keyedDedupLane(t)
	ctx := context.Background()
	if _, err := q.Publish(ctx, httpJob("x")); err != nil {
		t.Fatal(err)
	}
	delay := nats.Header{queue.HeaderThrottleDelay: []string{"1h"}}
	publishOutside(t, js, queue.Subject("demo", "k"), "x", "nats", delay)
	publishOutside(t, js, queue.Subject("demo", "k"), "y", "nats", delay)
	runIntake(t, q)
	intakeEmpty(t, js)
	if w, err := q.RetriesWaiting(ctx, "demo"); err != nil || w != 1 {
		t.Fatalf("the retry stream holds %d (%v), want only the delayed y", w, err)
	}
	if n := dropped.Load(); n != 1 {
		t.Errorf("OnDuplicate heard %d jobs, want 1 (the delayed x)", n)
	}
	if res, err := q.Publish(ctx, httpJob("y")); err != nil || !res.Duplicate {
		t.Fatalf("publish y over HTTP after the delayed y over NATS: %+v %v, want a duplicate", res, err)
	}
	if n := laneStored(t, q); n != 1 {
		t.Fatalf("the lane holds %d messages, want the HTTP x only (claims are deleted)", n)
	}
}

// TestKeyedIntakeDelayedDuplicateMovedBeforeItsClaim: a delayed job
// published over NATS whose id an HTTP job in the lane holds, and whose
// copy the retry mover moved into the lane before the copy's delete (its
// delay was nearly over when the intake's mover reached it), is taken out
// of the lane again: the copy is found under the msg id it was moved with,
// the intake move's, and the key's job is delivered once.
func TestKeyedIntakeDelayedDuplicateMovedBeforeItsClaim(t *testing.T) {
	q, js, _ := keyedDedupLane(t)
	ctx := context.Background()
	first, err := q.Publish(ctx, httpJob("x"))
	if err != nil {
		t.Fatal(err)
	}
	job := queue.Job{ID: "x", Lane: "demo", Key: "k", Payload: []byte("nats"), Outside: true,
		NotBefore: time.Now().Add(time.Hour), MsgID: queue.IntakeMoveMsgID(q, "demo", "x", 1)}
	stored, err := queue.StoreScheduled(ctx, q, job)
	if err != nil || stored.Duplicate {
		t.Fatalf("store the delayed copy: %+v %v", stored, err)
	}
	// The retry mover's move: the copy in the lane under its msg id, gone
	// from the retry stream.
	moved := job
	moved.NotBefore = time.Time{}
	if res, err := q.Publish(ctx, moved); err != nil || res.Duplicate {
		t.Fatalf("move the copy: %+v %v", res, err)
	}
	rs, err := js.Stream(ctx, queue.RetryStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.DeleteMsg(ctx, stored.Seq); err != nil {
		t.Fatal(err)
	}
	res, err := queue.ClaimID(ctx, q, job, stored)
	if err != nil || !res.Duplicate || !res.Queued || res.Seq != first.Seq {
		t.Fatalf("claim x: %+v %v, want a duplicate of seq %d, queued", res, err, first.Seq)
	}
	if n := laneStored(t, q); n != 1 {
		t.Fatalf("the lane holds %d jobs, want the HTTP x only (its delayed duplicate taken out)", n)
	}
}

// TestKeyedIntakeDelayedGivenIDWaitsOutItsClaim: a delayed job published
// over NATS with an id of its own, due almost at once, waits in the retry
// stream at least as long as its claim may take (as a delayed HTTP job
// with a claimed id does), so that the retry mover does not move it into
// the lane before the claim said whether the lane holds its id already.
func TestKeyedIntakeDelayedGivenIDWaitsOutItsClaim(t *testing.T) {
	q, js, _ := keyedDedupLane(t)
	ctx := context.Background()
	publishOutside(t, js, queue.Subject("demo", "k"), "x", "nats", nats.Header{queue.HeaderThrottleDelay: []string{"300ms"}})
	published := time.Now()
	runIntake(t, q)
	intakeEmpty(t, js)
	rs, err := js.Stream(ctx, queue.RetryStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rs.GetLastMsgForSubject(ctx, queue.RetrySubject("demo"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(raw.Header.Get(queue.HeaderNotBefore), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if nb := time.UnixMilli(ms); nb.Sub(published) < 900*time.Millisecond {
		t.Fatalf("the delayed copy is due %v after its publish, want at least about a second (its claim's guard)", nb.Sub(published))
	}
}
