package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// replayHook records what the queue tells it of replays, and can refuse.
type replayHook struct {
	mu     sync.Mutex
	heard  []records.Replay
	undone int
	fail   error
}

func (h *replayHook) Replaying(_ context.Context, r records.Replay) (func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail != nil {
		return nil, h.fail
	}
	h.heard = append(h.heard, r)
	return func() {
		h.mu.Lock()
		h.undone++
		h.mu.Unlock()
	}, nil
}

// waitDeadLetters waits until lane demo holds n dead letters, and returns
// them.
func waitDeadLetters(t *testing.T, q *queue.Queue, n int) []api.DeadLetter {
	t.Helper()
	var dead []api.DeadLetter
	waitForCond(t, fmt.Sprintf("%d dead letters", n), func() bool {
		dead, _ = q.ListDead(context.Background(), "demo", 0, 10)
		return len(dead) == n
	})
	return dead
}

// seqByID is the sequence of each dead letter, by its job's id.
func seqByID(dead []api.DeadLetter) map[string]uint64 {
	seq := make(map[string]uint64, len(dead))
	for _, d := range dead {
		seq[d.ID] = d.Seq
	}
	return seq
}

// TestReplayKeepsWhereTheRecordGoes: a dead letter keeps the job's
// callback, reply subject and expiry, and a replay stores them with the
// job again, after it told the replay hook. A job whose expiry passed is
// not replayed (ErrReplayExpired) and stays; replay-all passes over it
// without counting it against max. A hook that cannot write the record
// stops the replay: nothing is stored, the dead letter stays.
func TestReplayKeepsWhereTheRecordGoes(t *testing.T) {
	q, _ := newQueue(t, queue.LaneSpec{Name: "demo", MaxBacklog: 100, MaxInflight: 4, Prefetch: 1, AckWait: 5 * time.Second,
		MaxBody: 1024, DedupWindow: time.Minute})
	hook := &replayHook{}
	q.SetReplayHook(hook)
	ctx := context.Background()
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	past := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	jobs := []queue.Job{
		{ID: "gone", Lane: "demo", Payload: []byte("c"), Expires: past},
		{ID: "cb", Lane: "demo", Payload: []byte("a"), Callback: "https://h.example/cb"},
		{ID: "reply", Lane: "demo", Payload: []byte("b"), Reply: "replies.shop.1", Expires: later},
	}
	for _, j := range jobs {
		if _, err := q.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	// The expired one is dead-lettered as it is fetched; the others by
	// their target.
	c := consumer(t, q, "demo")
	for range 2 {
		m := nextJob(t, c, "a stored job")
		if err := m.Dead(ctx, queue.DeadInfo{Reason: "rejected by target", LastStatus: 400}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	dead := waitDeadLetters(t, q, 3)
	seq := seqByID(dead)
	for _, d := range dead {
		if want := map[string]time.Time{"reply": later, "gone": past}[d.ID]; (d.Expires == nil) != want.IsZero() || (d.Expires != nil && !d.Expires.Equal(want)) {
			t.Errorf("dead letter %s: expires %v, want %v", d.ID, d.Expires, want)
		}
	}

	if _, err := q.ReplayDead(ctx, "demo", seq["gone"], queue.ReplayOptions{}); !errors.Is(err, queue.ErrReplayExpired) {
		t.Fatalf("replay of an expired job: %v, want ErrReplayExpired", err)
	}
	hook.fail = errors.New("records down")
	if _, err := q.ReplayDead(ctx, "demo", seq["cb"], queue.ReplayOptions{}); !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("replay whose record cannot be written: %v, want ErrUnavailable", err)
	}
	hook.fail = nil
	if n, _ := q.CountDead(ctx, "demo"); n != 3 {
		t.Fatalf("%d dead letters after two refused replays, want 3", n)
	}
	got, err := q.ReplayAllDead(ctx, "demo", 2, 0)
	if err != nil || got.Replayed != 2 || got.Expired != 1 {
		t.Fatalf("replay all: %+v %v; want 2 replayed, 1 expired passed over", got, err)
	}
	if len(hook.heard) != 2 || hook.heard[0] != (records.Replay{Lane: "demo", ID: "cb", Callback: "https://h.example/cb", Seq: seq["cb"]}) ||
		hook.heard[1] != (records.Replay{Lane: "demo", ID: "reply", Seq: seq["reply"]}) || hook.undone != 0 {
		t.Fatalf("the hook heard %+v (undone %d)", hook.heard, hook.undone)
	}
	for range 2 {
		m := nextJob(t, c, "a replayed job")
		j := m.Job()
		switch j.ID {
		case "cb":
			if j.Callback != "https://h.example/cb" || j.Reply != "" || !j.Expires.IsZero() {
				t.Errorf("replayed cb: %+v", j)
			}
		case "reply":
			if j.Reply != "replies.shop.1" || j.Callback != "" || !j.Expires.Equal(later) {
				t.Errorf("replayed reply: %+v", j)
			}
		default:
			t.Errorf("replayed %s", j.ID)
		}
		if j.Attempts != 0 || j.RecordRev != 0 {
			t.Errorf("replayed %s: attempts %d, record revision %d; want none", j.ID, j.Attempts, j.RecordRev)
		}
		if j.ReplayedFrom != seq[j.ID] {
			t.Errorf("replayed %s: from dead letter #%d, want #%d", j.ID, j.ReplayedFrom, seq[j.ID])
		}
		m.Ack()
	}
	if dead, _ := q.ListDead(ctx, "demo", 0, 10); len(dead) != 1 || dead[0].ID != "gone" {
		t.Fatalf("dead letters left: %+v; want the expired one", dead)
	}
}

// TestReplayAllDeadUntil: a replay of all made of several calls passes the
// first call's Until to the others, so that a job the first replayed and
// that died again before the next call (a new dead letter, behind the
// bound) is not replayed twice; without a bound each call takes the dead
// letters stored when it begins.
func TestReplayAllDeadUntil(t *testing.T) {
	s := spec()
	s.MaxBacklog = 100
	q, nc := newQueue(t, s)
	ctx := context.Background()
	first := storeDead(t, nc, "demo", 2, 10)
	got, err := q.ReplayAllDead(ctx, "demo", 1, 0)
	until := got.Until // the dead-letter stream's last: other lanes' share it
	if err != nil || got.Replayed != 1 || until < first[1] {
		t.Fatalf("first call: %+v %v; want 1 replayed, until %d or later", got, err, first[1])
	}
	again := storeDead(t, nc, "demo", 1, 10) // the replayed job, dead again
	if again[0] <= until {
		t.Fatalf("the new dead letter %d is not behind the bound %d", again[0], until)
	}
	for i, want := range []int{1, 0} {
		got, err = q.ReplayAllDead(ctx, "demo", 1, until)
		if err != nil || got.Replayed != want || got.Until != until {
			t.Fatalf("call %d with until %d: %+v %v; want %d replayed", i+2, until, got, err, want)
		}
	}
	if d, err := q.ListDead(ctx, "demo", 0, 10); err != nil || len(d) != 1 || d[0].Seq != again[0] {
		t.Fatalf("dead letters left: %v %v; want the one dead again (%d)", d, err, again[0])
	}
	// A call without a bound takes it.
	if got, err := q.ReplayAllDead(ctx, "demo", 1, 0); err != nil || got.Replayed != 1 || got.Until < again[0] {
		t.Fatalf("a call without until: %+v %v", got, err)
	}
}
