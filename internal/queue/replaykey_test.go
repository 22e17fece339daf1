package queue_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// TestReplayUndeliverableRefused: on a keyed lane, the dead letter of a
// public job published without a key, or with one the key rules refuse,
// is not replayed as it is: the job would be stored on a subject the
// keyed reader never reads, never delivered. The replay is refused with
// an *UndeliverableError before anything is written (the record hook
// hears nothing, the lane stays empty, the dead letter stays), and
// replay-all passes over it, counting it, while it replays the others.
// A replay that gives the job a key the lane takes stores it on that
// key, where it is read.
func TestReplayUndeliverableRefused(t *testing.T) {
	q, js := keyedQueue(t)
	ctx := context.Background()
	hook := &replayHook{}
	q.SetReplayHook(hook)
	publishPoison(t, js, []poisonJob{{name: "no key", size: 1}, {name: "key with a slash", key: "a/b", size: 1}})
	publishPublic(t, js, "k", "k-0")
	runIntake(t, q)
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	var m *queue.Msg
	waitForCond(t, "k-0 on its key", func() bool {
		m, err = r.Next(ctx, "k", 1)
		return err == nil && m != nil
	})
	if err := m.Dead(ctx, queue.DeadInfo{Reason: "rejected by target", LastStatus: 400}, time.Second); err != nil {
		t.Fatal(err)
	}
	r.WaitDeletes()
	seq := seqByID(waitDeadLetters(t, q, 3))
	laneMsgs := func() uint64 { return msgsIn(t, js, queue.StreamName("demo")) }
	waitForCond(t, "the lane stream empty", func() bool { return laneMsgs() == 0 })

	for _, c := range []struct {
		id, key string
		reason  string
	}{
		{"no-key", "", "the job has no Throttle-Key; lane demo is keyed"},
		{"key-with-a-slash", "", "the job's Throttle-Key a/b is not a valid key"},
		{"no-key", "bad key", `the job's Throttle-Key bad\x20key is not a valid key`},
	} {
		_, err := q.ReplayDead(ctx, "demo", seq[c.id], queue.ReplayOptions{Key: c.key})
		var ue *queue.UndeliverableError
		if !errors.Is(err, queue.ErrReplayUndeliverable) || !errors.As(err, &ue) || !strings.Contains(ue.Reason, c.reason) ||
			ue.Seq != seq[c.id] || ue.ID != c.id || ue.Given != (c.key != "") {
			t.Fatalf("replay of %s with key %q: %v (%+v); want an UndeliverableError saying %q", c.id, c.key, err, ue, c.reason)
		}
	}
	if n, _ := q.CountDead(ctx, "demo"); n != 3 || len(hook.heard) != 0 || laneMsgs() != 0 {
		t.Fatalf("after refused replays: %d dead letters, hook heard %+v, %d jobs in the lane; want 3, nothing, 0", n, hook.heard, laneMsgs())
	}

	got, err := q.ReplayAllDead(ctx, "demo", 10, 0)
	if err != nil || got.Replayed != 1 || got.Undeliverable != 2 || !slices.Equal(got.UndeliverableSeqs, []uint64{seq["no-key"], seq["key-with-a-slash"]}) {
		t.Fatalf("replay all: %+v %v; want k-0 replayed, the other two passed over", got, err)
	}
	if n, _ := q.CountDead(ctx, "demo"); n != 2 {
		t.Fatalf("%d dead letters after replay all, want the 2 passed over", n)
	}

	d, err := q.ReplayDead(ctx, "demo", seq["no-key"], queue.ReplayOptions{Key: "k2"})
	if err != nil || d.Key != "k2" {
		t.Fatalf("replay of no-key with key k2: %+v %v", d, err)
	}
	if _, err := q.ReplayDead(ctx, "demo", seq["key-with-a-slash"], queue.ReplayOptions{Key: "k"}); err != nil {
		t.Fatalf("replay of key-with-a-slash with key k: %v", err)
	}
	if want := []records.Replay{{Lane: "demo", ID: "k-0", Key: "k", Seq: seq["k-0"]}, {Lane: "demo", ID: "no-key", Key: "k2", Seq: seq["no-key"]}, {Lane: "demo", ID: "key-with-a-slash", Key: "k", Seq: seq["key-with-a-slash"]}}; !slices.Equal(hook.heard, want) {
		t.Fatalf("the hook heard %+v, want %+v", hook.heard, want)
	}
	read := drainKeys(t, q, []string{"k", "k2"}, 3)
	if !slices.Equal(read["k"], []string{"k-0", "key-with-a-slash"}) || !slices.Equal(read["k2"], []string{"no-key"}) {
		t.Fatalf("read %v; want k: k-0, key-with-a-slash; k2: no-key", read)
	}
	if n, _ := q.CountDead(ctx, "demo"); n != 0 || laneMsgs() != 0 {
		t.Fatalf("%d dead letters, %d jobs in the lane; want none", n, laneMsgs())
	}
}

// TestKeyedKeysDeadLettersStranded: jobs an earlier version's replay
// stored on a keyed lane's keyless internal subject, or under a key the
// key rules refuse, are read by no key. Listing the keys (the sweep at
// start and every few seconds) dead-letters them, with the reason, so
// that they leave the backlog; a job on a key is left alone, and a delayed
// job's claim left behind is deleted.
func TestKeyedKeysDeadLettersStranded(t *testing.T) {
	q, js := keyedQueue(t)
	ctx := context.Background()
	for _, j := range []struct{ key, id string }{{"", "stranded-none"}, {"k", "good"}, {"a/b", "stranded-slash"}} {
		m := nats.NewMsg(queue.InternalSubject("demo", j.key))
		m.Data = []byte(j.id)
		m.Header.Set(queue.HeaderJobID, j.id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// A delayed job's claim on its id left behind (its delete failed) is
	// deleted, not dead-lettered: it is no job.
	publishClaim(t, js, "claimed")
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := r.Keys(ctx)
	if err != nil || !slices.Equal(keys, []string{"k"}) {
		t.Fatalf("keys %v (%v), want [k]", keys, err)
	}
	dead := waitDeadLetters(t, q, 2)
	want := map[string]string{"stranded-none": "stored with no key on keyed lane demo", "stranded-slash": "stored under a key the keyed lane's key rules refuse"}
	for _, d := range dead {
		if full, err := q.GetDead(ctx, "demo", d.Seq); err != nil || string(full.Payload) != d.ID {
			t.Errorf("dead letter %s: payload %q (%v), want its own", d.ID, full.Payload, err)
		}
		if !strings.Contains(d.Reason, want[d.ID]) || want[d.ID] == "" {
			t.Errorf("dead letter %s: reason %q; want one with %q", d.ID, d.Reason, want[d.ID])
		}
	}
	if n, _ := streamMsgs(t, js, queue.StreamName("demo")); n != 1 {
		t.Fatalf("%d jobs in the lane stream, want good alone", n)
	}
	if m, err := r.Next(ctx, "k", 1); err != nil || m == nil || m.Job().ID != "good" {
		t.Fatalf("key k read %v (%v), want good", m, err)
	}
	// A second sweep finds nothing more.
	if _, err := r.Keys(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := q.CountDead(ctx, "demo"); n != 2 {
		t.Fatalf("%d dead letters after a second sweep, want 2", n)
	}
}
