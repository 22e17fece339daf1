package queue_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/queue"
)

// keyedLane is a queue on a fresh server with the keyed lane "hooks".
func keyedLane(t *testing.T) (*queue.Queue, *nats.Conn) {
	t.Helper()
	q, nc := newBareQueue(t)
	s := queue.LaneSpec{Name: "hooks", MaxBacklog: 1000, MaxInflight: 4, Prefetch: 1, AckWait: 5 * time.Second, MaxBody: 1024, DedupWindow: time.Minute}
	if err := q.EnsureKeyedLane(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return q, nc
}

// TestBusiestKeys: a keyed lane's busiest keys are counted per subject by
// JetStream, most jobs first, ties by key, keys with dots whole, at most n;
// a lane without jobs has none.
func TestBusiestKeys(t *testing.T) {
	q, _ := keyedLane(t)
	ctx := context.Background()
	if got, err := q.BusiestKeys(ctx, "hooks", 3, 0); err != nil || len(got) != 0 {
		t.Fatalf("empty lane: %v %v, want no keys", got, err)
	}
	for key, n := range map[string]int{"cust.a": 7, "b": 3, "c": 3, "d": 1, "e@x": 12} {
		for i := range n {
			if _, err := q.Publish(ctx, queue.Job{ID: fmt.Sprintf("%s-%d", key, i), Lane: "hooks", Key: key, Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := q.BusiestKeys(ctx, "hooks", 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []queue.KeyCount{{Key: "e@x", Stored: 12}, {Key: "cust.a", Stored: 7}, {Key: "b", Stored: 3}, {Key: "c", Stored: 3}}
	if !slices.Equal(got, want) {
		t.Fatalf("busiest keys %v, want %v", got, want)
	}
	if _, err := q.BusiestKeys(ctx, "nope", 4, 0); err == nil {
		t.Fatal("an unknown lane gave no error")
	}
}

// TestBusiestKeysAreCached: a status polled many times costs one stream
// info for the busiest keys per maxAge, not one per poll. The calls are
// counted on the server: a second connection listens on the lane stream's
// info subject of the JetStream API and hears every request.
func TestBusiestKeysAreCached(t *testing.T) {
	q, nc := keyedLane(t)
	ctx := context.Background()
	spy, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spy.Close)
	sub, err := spy.SubscribeSync("$JS.API.STREAM.INFO." + queue.StreamName("hooks"))
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// infos counts the stream info requests the server has received, after
	// a round trip of nc's (so that its requests have all arrived).
	infos := func() int {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, err := sub.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	publish := func(key string) {
		t.Helper()
		if _, err := q.Publish(ctx, queue.Job{ID: key + "-" + fmt.Sprint(time.Now().UnixNano()), Lane: "hooks", Key: key, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	publish("a")
	for range 50 {
		got, err := q.BusiestKeys(ctx, "hooks", 5, time.Hour)
		if err != nil || !slices.Equal(got, []queue.KeyCount{{Key: "a", Stored: 1}}) {
			t.Fatalf("busiest keys %v %v", got, err)
		}
	}
	if n := infos(); n != 1 {
		t.Fatalf("50 polls within max age made %d stream info calls, want 1", n)
	}
	// Within max age the counts are the cached ones; a fresh read sees the
	// new job, and the backlog estimate takes its count too.
	publish("b")
	if got, _ := q.BusiestKeys(ctx, "hooks", 5, time.Hour); len(got) != 1 {
		t.Fatalf("cached busiest keys %v, want the one key of the first read", got)
	}
	if got, _ := q.BusiestKeys(ctx, "hooks", 5, 0); len(got) != 2 {
		t.Fatalf("fresh busiest keys %v, want two keys", got)
	}
	if n := infos(); n != 2 {
		t.Fatalf("%d stream info calls, want 2", n)
	}
	if b, err := q.Backlog(ctx, "hooks", time.Hour); err != nil || b != 2 {
		t.Fatalf("backlog estimate %d %v after the read, want 2", b, err)
	}
	if n := infos(); n != 2 {
		t.Fatalf("the backlog estimate made a stream info call of its own (%d in all)", n)
	}
	// Asking for more keys than the cached read kept reads again.
	if _, err := q.BusiestKeys(ctx, "hooks", 10, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := infos(); n != 3 {
		t.Fatalf("%d stream info calls, want 3", n)
	}
}
