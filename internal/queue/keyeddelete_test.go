package queue_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
)

// TestKeyedAckDeletesAfterwards: a settled keyed job's Ack returns before
// its delete is answered; meanwhile the job is never read again (Next
// passes over it, Keys leaves out a key with no other job), Settling waits
// for the key's deletes, and once they ended the message is gone.
func TestKeyedAckDeletesAfterwards(t *testing.T) {
	q, _ := newBareQueue(t)
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	undo := queue.OnDelete(func(uint64) { <-hold })
	defer undo()
	for _, id := range []string{"a1", "a2"} {
		if _, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo", Key: "a", Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "b1", Lane: "demo", Key: "b", Payload: []byte("b1")}); err != nil {
		t.Fatal(err)
	}
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	next := func(key string) *queue.Msg {
		t.Helper()
		m, err := r.Next(ctx, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a1, b1 := next("a"), next("b")
	if a1 == nil || b1 == nil || a1.Job().ID != "a1" || b1.Job().ID != "b1" {
		t.Fatalf("first jobs %v %v", a1, b1)
	}
	if err := a1.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := b1.Ack(); err != nil {
		t.Fatal(err)
	}
	// Both deletes held: a1 and b1 are still stored, and never read again.
	if m := next("a"); m == nil || m.Job().ID != "a2" {
		t.Fatalf("a's next with a1's delete on its way: %v, want a2", m)
	}
	if m := next("b"); m != nil {
		t.Fatalf("b's next with b1's delete on its way: %s, want none", m.Job().ID)
	}
	keys, err := r.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"a"}) {
		t.Fatalf("keys %v with b's only job settled, want [a]", keys)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := r.Settling(short, "b"); err == nil {
		t.Fatal("Settling returned with b1's delete held")
	}
	close(hold)
	if err := r.Settling(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	r.WaitDeletes()
	if n, err := q.Backlog(ctx, "demo", 0); err != nil || n != 1 {
		t.Fatalf("backlog %d, %v once the deletes ended; want 1 (a2)", n, err)
	}
	if m := next("b"); m != nil {
		t.Fatalf("b1 read after its delete: %s", m.Job().ID)
	}
}

// TestKeyedDeletesSentTogether: the deletes of jobs settled while one is
// under way go out together once it ended, every one answered: the lane
// is empty after, a job deleted already (settled twice) counts as
// deleted, and Settling returns for each key.
func TestKeyedDeletesSentTogether(t *testing.T) {
	q, nc := newBareQueue(t)
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	var sent []uint64
	undo := queue.OnDelete(func(seq uint64) {
		sent = append(sent, seq) // one sender at a time
		if len(sent) == 1 {
			<-hold
		}
	})
	defer undo()
	keys := []string{"a", "b", "c"}
	for i := range 21 {
		key := keys[i%3]
		if _, err := q.Publish(ctx, queue.Job{ID: fmt.Sprintf("j%d", i), Lane: "demo", Key: key, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var msgs []*queue.Msg
	for _, key := range keys {
		for from := uint64(1); ; {
			m, err := r.Next(ctx, key, from)
			if err != nil {
				t.Fatal(err)
			}
			if m == nil {
				break
			}
			msgs = append(msgs, m)
			from = m.Seq() + 1
		}
	}
	if len(msgs) != 21 {
		t.Fatalf("read %d jobs, want 21", len(msgs))
	}
	// The last job is deleted by someone else first: its delete finds it gone.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, queue.StreamName("demo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, msgs[20].Seq()); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range keys {
		if m, err := r.Next(ctx, key, 1); err != nil || m != nil {
			t.Fatalf("%s's next with every job's delete on its way: %v, %v; want none", key, m, err)
		}
	}
	close(hold)
	for _, key := range keys {
		if err := r.Settling(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	r.WaitDeletes()
	if len(sent) != 21 {
		t.Fatalf("%d deletes sent, want 21", len(sent))
	}
	if n, err := q.Backlog(ctx, "demo", 0); err != nil || n != 0 {
		t.Fatalf("backlog %d, %v once the deletes ended; want 0", n, err)
	}
	if got, err := r.Keys(ctx); err != nil || len(got) != 0 {
		t.Fatalf("keys %v, %v once every job was deleted; want none", got, err)
	}
}
