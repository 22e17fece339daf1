package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
)

// TestTriesClearedLeaveNothing: an ordered job's stored attempts are read
// back, and once the job is settled its entry is gone from the bucket's
// stream, not left as a delete marker for a week per settled job.
func TestTriesClearedLeaveNothing(t *testing.T) {
	t.Parallel()
	q, nc := newBareQueue(t)
	spec := intakeSpec(100)
	spec.Ordered = true
	ctx := context.Background()
	// The bucket as the first release made it: set up again, it gets
	// markers that lapse.
	js, _ := jetstream.New(nc)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: queue.TriesBucket, History: 1, TTL: 7 * 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureKeyedLane(ctx, spec); err != nil {
		t.Fatal(err)
	}
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if err := r.SetTries(ctx, seq, 1); err != nil {
			t.Fatal(err)
		}
		if err := r.SetTries(ctx, seq, 2); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := r.Tries(ctx, 2); err != nil || n != 2 {
		t.Fatalf("tries of 2: %d, %v; want 2", n, err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if err := r.ClearTries(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.ClearTries(ctx, 9); err != nil {
		t.Fatalf("clearing tries never stored: %v", err)
	}
	if n, err := r.Tries(ctx, 2); err != nil || n != 0 {
		t.Fatalf("tries of 2 after clearing: %d, %v; want 0", n, err)
	}
	// The purge markers lapse by themselves, within seconds.
	waitForCond(t, "the tries bucket's stream empty after every job was settled", func() bool {
		n, _ := streamMsgs(t, js, "KV_"+queue.TriesBucket)
		return n == 0
	})
}

// TestTriesBadEntryDoesNotHoldTheKey: an entry that is not a count (written
// by hand) must not make every read of the key's oldest job fail for the
// bucket's week: it counts as no stored attempts.
func TestTriesBadEntryDoesNotHoldTheKey(t *testing.T) {
	q, nc := newBareQueue(t)
	spec := intakeSpec(100)
	spec.Ordered = true
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, spec); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, queue.TriesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "demo.5", []byte("lots")); err != nil {
		t.Fatal(err)
	}
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Tries(ctx, 5); err != nil || n != 0 {
		t.Fatalf("tries of a bad entry: %d, %v; want 0, no error", n, err)
	}
}
