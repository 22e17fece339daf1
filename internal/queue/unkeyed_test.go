package queue_test

import (
	"context"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/queue"
)

// TestUnkeyedLaneOnKeyedStream: a keyed lane whose per_key was removed is
// refused at start with what to do, naming per_key, and its jobs stay
// stored; the refusal was JetStream's own ("can not change retention
// policy to/from workqueue"), which said neither.
func TestUnkeyedLaneOnKeyedStream(t *testing.T) {
	q, nc := newBareQueue(t)
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, queue.Job{ID: "a1", Lane: "demo", Key: "a", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	q2, _ := bareQueueOn(t, nc.ConnectedUrl())
	err := q2.EnsureLane(ctx, intakeSpec(100))
	if err == nil || !strings.Contains(err.Error(), "per_key") || !strings.Contains(err.Error(), queue.StreamName("demo")) {
		t.Fatalf("EnsureLane of a keyed lane's stream: %v, want a refusal naming per_key and the stream", err)
	}
	r, err := reconnect(t, nc, intakeSpec(100)).KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := r.Next(ctx, "a", 1); err != nil || m == nil || m.Job().ID != "a1" {
		t.Fatalf("the key's job after the refusal: %v, %v", m, err)
	}
}
