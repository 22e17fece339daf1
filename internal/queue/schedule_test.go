package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/testenv"
)

// TestParseSchedule: what a submission may ask of its job's start, read at
// a fixed now (time as a value, no clock): delays in both spellings, a
// not-before in the past is now, and every refusal names its field.
func TestParseSchedule(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	rfc := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	const maxDelay = 24 * time.Hour
	for _, tt := range []struct {
		name      string
		w         queue.When
		notBefore time.Time
		expires   time.Time
		field     string // the refused field; "" for none
	}{
		{name: "nothing", w: queue.When{}},
		{name: "delay 90s", w: queue.When{Delay: "90s"}, notBefore: t0.Add(90 * time.Second)},
		{name: "delay in seconds", w: queue.When{Delay: "90"}, notBefore: t0.Add(90 * time.Second)},
		{name: "delay 1h30m", w: queue.When{Delay: "1h30m"}, notBefore: t0.Add(90 * time.Minute)},
		{name: "delay zero is now", w: queue.When{Delay: "0s"}},
		{name: "delay at max_delay", w: queue.When{Delay: "24h"}, notBefore: t0.Add(maxDelay)},
		{name: "delay over max_delay", w: queue.When{Delay: "24h0m1s"}, field: "delay"},
		{name: "delay huge number", w: queue.When{Delay: "99999999999999999999"}, field: "delay"},
		{name: "delay negative", w: queue.When{Delay: "-5s"}, field: "delay"},
		{name: "delay not a duration", w: queue.When{Delay: "soon"}, field: "delay"},
		{name: "delay float without unit", w: queue.When{Delay: "1.5"}, field: "delay"},
		{name: "delay too long a value", w: queue.When{Delay: strings.Repeat("1", 65) + "s"}, field: "delay"},
		{name: "not-before ahead", w: queue.When{NotBefore: rfc(t0.Add(time.Minute))}, notBefore: t0.Add(time.Minute)},
		{name: "not-before with offset", w: queue.When{NotBefore: "2026-01-02T16:05:05+01:00"}, notBefore: t0.Add(time.Minute)},
		{name: "not-before in the past is now", w: queue.When{NotBefore: rfc(t0.Add(-time.Hour))}},
		{name: "not-before past max_delay", w: queue.When{NotBefore: rfc(t0.Add(maxDelay + time.Second))}, field: "not_before"},
		{name: "not-before not RFC 3339", w: queue.When{NotBefore: "tomorrow"}, field: "not_before"},
		{name: "delay and not-before", w: queue.When{Delay: "1s", NotBefore: rfc(t0.Add(time.Minute))}, field: "not_before"},
		{name: "expires ahead", w: queue.When{Expires: rfc(t0.Add(time.Minute))}, expires: t0.Add(time.Minute)},
		{name: "expires now", w: queue.When{Expires: rfc(t0)}, field: "expires"},
		{name: "expires in the past", w: queue.When{Expires: rfc(t0.Add(-time.Second))}, field: "expires"},
		{name: "expires not RFC 3339", w: queue.When{Expires: "1767366245"}, field: "expires"},
		{name: "expires after the delay", w: queue.When{Delay: "10s", Expires: rfc(t0.Add(11 * time.Second))},
			notBefore: t0.Add(10 * time.Second), expires: t0.Add(11 * time.Second)},
		{name: "expires before not-before: expires while it waits", w: queue.When{NotBefore: rfc(t0.Add(time.Hour)), Expires: rfc(t0.Add(time.Minute))},
			notBefore: t0.Add(time.Hour), expires: t0.Add(time.Minute)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := queue.ParseSchedule(tt.w, t0, maxDelay)
			if tt.field != "" {
				var se *queue.ScheduleError
				if !errors.As(err, &se) || se.Field != tt.field || !errors.Is(err, queue.ErrBadSchedule) {
					t.Fatalf("err %v, want a ScheduleError on %s", err, tt.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !s.NotBefore.Equal(tt.notBefore) || !s.Expires.Equal(tt.expires) {
				t.Fatalf("got %+v, want not-before %v, expires %v", s, tt.notBefore, tt.expires)
			}
		})
	}
}

// hookLog records what a ScheduleHook hears.
type hookLog struct {
	mu     sync.Mutex
	events []string
}

func (h *hookLog) add(s string) { h.mu.Lock(); h.events = append(h.events, s); h.mu.Unlock() }
func (h *hookLog) Scheduled(lane, id string, _ time.Time, _ string) {
	h.add("scheduled " + lane + " " + id)
}
func (h *hookLog) Entered(lane, id string)    { h.add("entered " + lane + " " + id) }
func (h *hookLog) Expired(lane, id, _ string) { h.add("expired " + lane + " " + id) }
func (h *hookLog) count(ev string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.events {
		if e == ev {
			n++
		}
	}
	return n
}

// roomyQueue is newQueue with spec()'s lane demo taking 100 jobs, so that
// what a test schedules never meets the backlog limit.
func roomyQueue(t *testing.T) (*queue.Queue, *nats.Conn) {
	t.Helper()
	s := spec()
	s.MaxBacklog = 100
	return newQueue(t, s)
}

// laneStored is the count of jobs in lane demo's stream.
func laneStored(t *testing.T, q *queue.Queue) uint64 {
	t.Helper()
	st, err := q.Stats(context.Background(), "demo")
	if err != nil {
		t.Fatal(err)
	}
	return st.Stored
}

// TestScheduledJobEntersItsLaneOnceWhenDue: a delayed job stored by one
// instance, which then goes away, is moved into its lane by the others
// (two movers on one shared consumer: a fleet after a restart), once, no
// earlier than its time; until then it is in no lane count. The hook hears
// it scheduled and entered, once each. It keeps what the instance that
// settles it needs: where its caller waits, its callback, its owner and
// its record's revision.
func TestScheduledJobEntersItsLaneOnceWhenDue(t *testing.T) {
	s := spec()
	s.MaxBacklog = 100
	q1, nc := newQueue(t, s)
	hook := &hookLog{}
	q1.SetScheduleHook(hook)
	ctx := context.Background()
	due := time.Now().Add(1500 * time.Millisecond)
	res, err := q1.Schedule(ctx, queue.Job{ID: "later", Lane: "demo", Payload: []byte("x"), NotBefore: due,
		Wait: records.WaitSubject("inst1"), Callback: "https://hooks.example.com/later", Owner: "a", RecordRev: 7})
	if err != nil || res.Duplicate {
		t.Fatalf("schedule: %+v %v", res, err)
	}
	// The same id again within the dedup window stores nothing new.
	if res, err := q1.Schedule(ctx, queue.Job{ID: "later", Lane: "demo", Payload: []byte("x"), NotBefore: due}); err != nil || !res.Duplicate {
		t.Fatalf("schedule again: %+v %v, want a duplicate", res, err)
	}
	// Two other instances move it; the first one never runs a mover.
	var others []*queue.Queue
	for range 2 {
		q, _ := bareQueueOn(t, nc.ConnectedUrl())
		if err := q.EnsureLane(ctx, s); err != nil {
			t.Fatal(err)
		}
		q.SetScheduleHook(hook)
		moveRetries(t, q, "demo")
		others = append(others, q)
	}
	if n := laneStored(t, q1); n != 0 && time.Now().Before(due) {
		t.Fatalf("the lane holds %d jobs before the delayed job is due", n)
	}
	if w, err := q1.RetriesWaiting(ctx, "demo"); err != nil || w != 1 {
		t.Fatalf("waiting %d %v, want the delayed job", w, err)
	}
	c := consumer(t, others[0], "demo")
	m := nextJob(t, c, "the delayed job")
	if j := m.Job(); j.ID != "later" || j.Wait != records.WaitSubject("inst1") || j.Callback != "https://hooks.example.com/later" || j.Owner != "a" || j.RecordRev != 7 {
		t.Fatalf("got job %+v", j)
	}
	if m.StoredAt().Before(due.Add(-5 * time.Millisecond)) {
		t.Fatalf("entered the lane at %v, before its time %v", m.StoredAt(), due)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the retry stream empty", func() bool {
		w, err := q1.RetriesWaiting(ctx, "demo")
		return err == nil && w == 0
	})
	// Moved once: after the ack nothing is left in the lane, and the
	// stream's last sequence says one job was ever stored there.
	testenv.Eventually(t, 5*time.Second, "the lane empty", func() bool { return laneStored(t, q1) == 0 })
	js, _ := jetstream.New(nc)
	st, _ := js.Stream(ctx, queue.StreamName("demo"))
	if info, err := st.Info(ctx); err != nil || info.State.LastSeq != 1 {
		t.Fatalf("lane stream last seq %v (%v), want 1: the job entered the lane more than once", info.State.LastSeq, err)
	}
	if hook.count("scheduled demo later") != 1 || hook.count("entered demo later") != 1 {
		t.Fatalf("hook heard %v", hook.events)
	}
}

// deadReasons lists lane demo's dead letters as id → reason.
func deadReasons(t *testing.T, q *queue.Queue) map[string]string {
	t.Helper()
	ds, err := q.ListDead(context.Background(), "demo", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range ds {
		out[d.ID] = d.Reason
	}
	return out
}

// TestScheduledJobExpiresBeforeItIsDue: a delayed job whose expiry comes
// before its time never enters its lane: it is a dead letter with the
// reason "expired" once its expiry passed, and the hook hears it.
func TestScheduledJobExpiresBeforeItIsDue(t *testing.T) {
	q, _ := newQueue(t, spec())
	hook := &hookLog{}
	q.SetScheduleHook(hook)
	now := time.Now()
	expires := now.Add(500 * time.Millisecond)
	if _, err := q.Schedule(context.Background(), queue.Job{ID: "stale", Lane: "demo", Payload: []byte("x"),
		NotBefore: now.Add(time.Hour), Expires: expires}); err != nil {
		t.Fatal(err)
	}
	moveRetries(t, q, "demo")
	testenv.Eventually(t, 10*time.Second, "the expired dead letter", func() bool { return deadReasons(t, q)["stale"] == queue.ReasonExpired })
	if time.Now().Before(expires) {
		t.Fatal("dead-lettered before its expiry")
	}
	if n := laneStored(t, q); n != 0 {
		t.Fatalf("the lane holds %d jobs: the expired job entered it", n)
	}
	if w, _ := q.RetriesWaiting(context.Background(), "demo"); w != 0 {
		t.Fatalf("%d jobs still wait", w)
	}
	if hook.count("expired demo stale") != 1 || hook.count("entered demo stale") != 0 {
		t.Fatalf("hook heard %v", hook.events)
	}
}

// TestExpiredJobInBacklogDeadLetteredAtFetch: a job that expired while it
// waited in its lane is dead-lettered (reason "expired") when a drain
// fetches it, before it reaches the drain; the job behind it comes next.
// A retry (a job that started before) no longer expires.
func TestExpiredJobInBacklogDeadLetteredAtFetch(t *testing.T) {
	q, _ := roomyQueue(t)
	ctx := context.Background()
	past := time.Now().Add(-time.Millisecond)
	for _, j := range []queue.Job{
		{ID: "gone", Lane: "demo", Payload: []byte("x"), Expires: past},
		{ID: "fresh", Lane: "demo", Payload: []byte("y"), Expires: time.Now().Add(time.Hour)},
	} {
		if _, err := q.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	c := consumer(t, q, "demo")
	m := nextJob(t, c, "the fresh job")
	if m.Job().ID != "fresh" {
		t.Fatalf("the drain got %s first: an expired job reached it", m.Job().ID)
	}
	if m.Expired(time.Now()) {
		t.Fatal("the fresh job says it expired")
	}
	if r := deadReasons(t, q)["gone"]; r != queue.ReasonExpired {
		t.Fatalf("the expired job's dead letter reason %q, want %q", r, queue.ReasonExpired)
	}
	// Its retry copy keeps no expiry.
	if err := m.Retry(ctx, 0); err != nil {
		t.Fatal(err)
	}
	moveRetries(t, q, "demo")
	r := nextJob(t, c, "the retry")
	if r.Job().ID != "fresh" || r.Attempt() != 2 || !r.Expiry().IsZero() {
		t.Fatalf("retry %s attempt %d expiry %v", r.Job().ID, r.Attempt(), r.Expiry())
	}
	_ = r.Ack()
}

// TestPublicJobDelayHeaders: a job published on the lane's public subject
// with Throttle-Delay waits outside the lane and reaches the drain no
// earlier than the delay after JetStream stored it; one whose
// Throttle-Delay cannot be read is dead-lettered, the header named.
func TestPublicJobDelayHeaders(t *testing.T) {
	q, nc := roomyQueue(t)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	publish := func(id string, h map[string]string) time.Time {
		m := nats.NewMsg(queue.Subject("demo", ""))
		m.Data = []byte(id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		for k, v := range h {
			m.Header.Set(k, v)
		}
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := js.Stream(ctx, ack.Stream)
		if err != nil {
			t.Fatal(err)
		}
		got, err := raw.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		return got.Time
	}
	publish("bad", map[string]string{queue.HeaderThrottleDelay: "soon"})
	stored := publish("delayed", map[string]string{queue.HeaderThrottleDelay: "1s", queue.HeaderThrottleExpires: time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
	moveRetries(t, q, "demo")
	c := consumer(t, q, "demo")
	m := nextJob(t, c, "the delayed public job")
	if m.Job().ID != "delayed" {
		t.Fatalf("got %s", m.Job().ID)
	}
	if now := time.Now(); now.Before(stored.Add(time.Second - 5*time.Millisecond)) {
		t.Fatalf("reached the drain %v after its store, before its delay of 1s", now.Sub(stored))
	}
	if m.Expiry().IsZero() {
		t.Fatal("the delayed job lost its Throttle-Expires")
	}
	_ = m.Ack()
	if r := deadReasons(t, q)["bad"]; !strings.Contains(r, "invalid Throttle-Delay") {
		t.Fatalf("bad job's dead letter reason %q, want it to name Throttle-Delay", r)
	}
}

// publishClaim stores on lane demo's keyless internal subject the claim
// a delayed job makes on its id, as if its delete had not happened yet.
func publishClaim(t *testing.T, js jetstream.JetStream, id string) {
	t.Helper()
	publishOutside(t, js, queue.InternalSubject("demo", ""), id, "", nats.Header{"Throttler-Claim": {"1"}})
}

// TestClaimedIDOneJobWhateverTheDelay: a delayed job stored with ClaimID
// claims its id in its lane's stream, so that the lane's de-duplication
// sees one job whatever the delay: a job of that id published after it is
// a duplicate; a delayed job whose id a job without a delay holds already
// is a duplicate of that one (Queued, its place in the lane), and its copy
// is taken out of the retry stream again; the same id delayed again is a
// duplicate. The claims leave the lane's stream at once, and a drain that
// fetches one anyway acks it and hands out the job after it instead.
func TestClaimedIDOneJobWhateverTheDelay(t *testing.T) {
	q, nc := roomyQueue(t)
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	if res, err := q.Schedule(ctx, queue.Job{ID: "a", Lane: "demo", Payload: []byte("x"), NotBefore: later, ClaimID: true}); err != nil || res.Duplicate {
		t.Fatalf("schedule a: %+v %v", res, err)
	}
	if res, err := q.Publish(ctx, queue.Job{ID: "a", Lane: "demo", Payload: []byte("x")}); err != nil || !res.Duplicate {
		t.Fatalf("a without a delay after the delayed a: %+v %v, want a duplicate", res, err)
	}
	if res, err := q.Schedule(ctx, queue.Job{ID: "a", Lane: "demo", Payload: []byte("x"), NotBefore: later.Add(time.Hour), ClaimID: true}); err != nil || !res.Duplicate || res.Queued {
		t.Fatalf("a delayed again: %+v %v, want a duplicate of the delayed a", res, err)
	}
	first, err := q.Publish(ctx, queue.Job{ID: "b", Lane: "demo", Payload: []byte("x")})
	if err != nil || first.Duplicate {
		t.Fatalf("publish b: %+v %v", first, err)
	}
	res, err := q.Schedule(ctx, queue.Job{ID: "b", Lane: "demo", Payload: []byte("x"), NotBefore: later, ClaimID: true})
	if err != nil || !res.Duplicate || !res.Queued || res.Seq != first.Seq {
		t.Fatalf("b delayed after b without a delay: %+v %v, want a duplicate of seq %d, queued", res, err, first.Seq)
	}
	if w, err := q.RetriesWaiting(ctx, "demo"); err != nil || w != 1 {
		t.Fatalf("retry stream holds %d (%v), want only the delayed a", w, err)
	}
	if n := laneStored(t, q); n != 1 {
		t.Fatalf("the lane holds %d messages, want b only (claims are deleted)", n)
	}
	// A claim a drain fetches before it is deleted is no job.
	js, _ := jetstream.New(nc)
	publishClaim(t, js, "c")
	if _, err := q.Publish(ctx, queue.Job{ID: "d", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c := consumer(t, q, "demo")
	for _, want := range []string{"b", "d"} {
		m := nextJob(t, c, want)
		if m.Job().ID != want {
			t.Fatalf("got job %q, want %q", m.Job().ID, want)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the claim acked, the lane empty", func() bool { return laneStored(t, q) == 0 })
}

// TestClaimedIDDelayedAgainAfterQueued: a delayed job whose id a job
// without a delay holds is answered as that job (Queued, its place in the
// lane) every time it is submitted again with a delay, not only the
// first: its delayed copy was taken out, and the retry stream remembering
// its msg id does not make it a scheduled job.
func TestClaimedIDDelayedAgainAfterQueued(t *testing.T) {
	q, _ := roomyQueue(t)
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	first, err := q.Publish(ctx, queue.Job{ID: "b", Lane: "demo", Payload: []byte("x")})
	if err != nil || first.Duplicate {
		t.Fatalf("publish b: %+v %v", first, err)
	}
	for i, delay := range []time.Duration{0, time.Minute, time.Minute} {
		res, err := q.Schedule(ctx, queue.Job{ID: "b", Lane: "demo", Payload: []byte("x"), NotBefore: later.Add(delay), ClaimID: true})
		if err != nil || !res.Duplicate || !res.Queued || res.Seq != first.Seq {
			t.Fatalf("b delayed (submission %d) after b without a delay: %+v %v, want a duplicate of seq %d, queued", i+1, res, err, first.Seq)
		}
	}
	if w, err := q.RetriesWaiting(ctx, "demo"); err != nil || w != 0 {
		t.Fatalf("retry stream holds %d (%v), want nothing", w, err)
	}
}

// TestClaimsAreNoJobsAhead: the claims of delayed jobs' ids take sequences
// of their lane's stream, and are deleted at once: a job stored after them
// does not count them among the jobs waiting ahead of it (its eta).
func TestClaimsAreNoJobsAhead(t *testing.T) {
	q, _ := roomyQueue(t)
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "first", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := q.Schedule(ctx, queue.Job{ID: fmt.Sprintf("later-%d", i), Lane: "demo", Payload: []byte("x"),
			NotBefore: time.Now().Add(time.Hour), ClaimID: true}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := q.Publish(ctx, queue.Job{ID: "second", Lane: "demo", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.Ahead(ctx, "demo", "", res.Seq, 0); err != nil || n != 1 {
		t.Fatalf("ahead of the second job: %d (%v), want 1 (the first; the 5 claims between are no jobs)", n, err)
	}
}

// TestClaimedIDShortDelayOneJob: a delayed job due at once (a delay of a
// millisecond, or a not-before a client's clock put just ahead), whose id
// a job without a delay holds, is a duplicate of that job, as any delayed
// job is: the retry mover, waiting for work, must not move its copy into
// the lane before the claim said it is a duplicate (the lane would hold
// the id's job twice, and the submission would fail on the copy's delete).
func TestClaimedIDShortDelayOneJob(t *testing.T) {
	q, _ := roomyQueue(t)
	ctx, cancel := context.WithCancel(context.Background())
	moved := make(chan struct{})
	defer func() { cancel(); <-moved }()
	go func() { defer close(moved); q.MoveRetries(ctx, "demo", slogDiscard()) }()
	first, err := q.Publish(ctx, queue.Job{ID: "x", Lane: "demo", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"x", "y"} {
		res, err := q.Schedule(ctx, queue.Job{ID: id, Lane: "demo", Payload: []byte("x"), NotBefore: time.Now().Add(time.Millisecond), ClaimID: true})
		if id == "x" && (err != nil || !res.Duplicate || !res.Queued || res.Seq != first.Seq) {
			t.Fatalf("x delayed by 1ms after x without a delay: %+v %v, want a duplicate of seq %d, queued", res, err, first.Seq)
		}
		if id == "y" && (err != nil || res.Duplicate) {
			t.Fatalf("y delayed by 1ms: %+v %v", res, err)
		}
	}
	// y enters the lane when due; x is there once. A copy leaves the
	// retry stream only after its move is stored (or when deleted): with
	// none left, every move is in the lane.
	testenv.Eventually(t, 10*time.Second, "y moved into the lane, no copy left", func() bool {
		w, err := q.RetriesWaiting(ctx, "demo")
		return err == nil && w == 0 && laneStored(t, q) >= 2
	})
	if n := laneStored(t, q); n != 2 {
		t.Fatalf("the lane holds %d jobs, want x once and y", n)
	}
}

// TestClaimedIDResubmittedAfterCopyLeft: a delayed job whose id a job
// without a delay holds, whose copy could not be deleted from the retry
// stream when it was first submitted (the submission failed), is answered
// as that job when submitted again, and its copy is taken out then: it
// must not enter the lane when due and deliver the id twice.
func TestClaimedIDResubmittedAfterCopyLeft(t *testing.T) {
	q, _ := roomyQueue(t)
	ctx := context.Background()
	first, err := q.Publish(ctx, queue.Job{ID: "b", Lane: "demo", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	// The first delayed submission's copy, left where its delete failed.
	job := queue.Job{ID: "b", Lane: "demo", Payload: []byte("x"), NotBefore: later, MsgID: queue.ScheduledMsgID("demo", "b")}
	if _, err := queue.StoreScheduled(ctx, q, job); err != nil {
		t.Fatal(err)
	}
	res, err := q.Schedule(ctx, queue.Job{ID: "b", Lane: "demo", Payload: []byte("x"), NotBefore: later, ClaimID: true})
	if err != nil || !res.Duplicate || !res.Queued || res.Seq != first.Seq {
		t.Fatalf("b delayed again: %+v %v, want a duplicate of seq %d, queued", res, err, first.Seq)
	}
	if w, err := q.RetriesWaiting(ctx, "demo"); err != nil || w != 0 {
		t.Fatalf("the retry stream holds %d (%v), want nothing: the left copy would deliver b twice", w, err)
	}
}

// TestClaimRedeliveredReadsNoTries: a claim a drain fetches again (its
// first delivery handed back) is acked as no job before anything reads
// the tries bucket for it: it has no failed attempts to read.
func TestClaimRedeliveredReadsNoTries(t *testing.T) {
	q, nc := roomyQueue(t)
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	publishClaim(t, js, "c")
	raw, err := js.Consumer(ctx, queue.StreamName("demo"), queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	b, err := raw.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "d", Lane: "demo", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c := consumer(t, q, "demo")
	if m := nextJob(t, c, "d"); m.Job().ID != "d" {
		t.Fatalf("got job %q, want d", m.Job().ID)
	}
	if n := queue.TriesReads(c); n != 0 {
		t.Fatalf("the tries bucket was read %d times, want 0 (a claim has no tries)", n)
	}
}
