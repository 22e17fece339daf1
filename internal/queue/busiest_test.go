package queue_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/queue"
)

// TestBusiestKeys: a keyed lane's busiest keys are counted per subject by
// JetStream, most jobs first, ties by key, keys with dots whole, at most n;
// a lane without jobs has none.
func TestBusiestKeys(t *testing.T) {
	q, _ := newBareQueue(t)
	ctx := context.Background()
	s := queue.LaneSpec{Name: "hooks", MaxBacklog: 1000, MaxInflight: 4, Prefetch: 1, AckWait: 5 * time.Second, MaxBody: 1024, DedupWindow: time.Minute}
	if err := q.EnsureKeyedLane(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got, err := q.BusiestKeys(ctx, "hooks", 3); err != nil || len(got) != 0 {
		t.Fatalf("empty lane: %v %v, want no keys", got, err)
	}
	for key, n := range map[string]int{"cust.a": 7, "b": 3, "c": 3, "d": 1, "e@x": 12} {
		for i := range n {
			if _, err := q.Publish(ctx, queue.Job{ID: fmt.Sprintf("%s-%d", key, i), Lane: "hooks", Key: key, Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := q.BusiestKeys(ctx, "hooks", 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []queue.KeyCount{{Key: "e@x", Stored: 12}, {Key: "cust.a", Stored: 7}, {Key: "b", Stored: 3}, {Key: "c", Stored: 3}}
	if !slices.Equal(got, want) {
		t.Fatalf("busiest keys %v, want %v", got, want)
	}
	if _, err := q.BusiestKeys(ctx, "nope", 4); err == nil {
		t.Fatal("an unknown lane gave no error")
	}
}
