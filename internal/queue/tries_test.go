package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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

// orderedReader sets up the ordered keyed lane demo on q and returns its
// reader and the tries bucket.
func orderedReader(t *testing.T, q *queue.Queue, nc *nats.Conn) (*queue.KeyedReader, jetstream.KeyValue) {
	t.Helper()
	spec := intakeSpec(100)
	spec.Ordered = true
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, spec); err != nil {
		t.Fatal(err)
	}
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, queue.TriesBucket)
	if err != nil {
		t.Fatal(err)
	}
	return r, kv
}

// TestTriesOfARecreatedKeyedStreamNotCounted: counts left in the tries
// bucket by jobs of an ordered lane's stream that was deleted (nats stream
// rm, a switch between keyed and plain) are not the counts of the jobs the
// re-created stream stores at the same sequences, whether this release or
// an earlier one (entry "<lane>.<stream sequence>") wrote them: those jobs
// would be dead-lettered before max_attempts.
func TestTriesOfARecreatedKeyedStreamNotCounted(t *testing.T) {
	q, nc := newBareQueue(t)
	r, kv := orderedReader(t, q, nc)
	ctx := context.Background()
	if err := r.SetTries(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "demo.2", []byte("3")); err != nil { // an earlier release's entry
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if err := js.DeleteStream(ctx, queue.StreamName("demo")); err != nil {
		t.Fatal(err)
	}
	q2, nc2 := bareQueueOn(t, nc.ConnectedUrl())
	r2, _ := orderedReader(t, q2, nc2)
	for seq := uint64(1); seq <= 2; seq++ {
		if n, err := r2.Tries(ctx, seq); err != nil || n != 0 {
			t.Fatalf("tries of the re-created stream's job %d: %d, %v; want 0", seq, n, err)
		}
	}
}

// TestTriesOfAnEarlierReleaseHonoured: an earlier release named a job's
// entry "<lane>.<stream sequence>"; found when the lane starts, such
// entries are read too: written since the lane stream was made, one is the
// job's count, until this release stores its own; and a settled job's
// entry is cleared under both names.
func TestTriesOfAnEarlierReleaseHonoured(t *testing.T) {
	q0, nc0 := newBareQueue(t)
	_, kv := orderedReader(t, q0, nc0)
	ctx := context.Background()
	if _, err := kv.Put(ctx, "demo.4", []byte("2")); err != nil {
		t.Fatal(err)
	}
	q, nc := bareQueueOn(t, nc0.ConnectedUrl())
	r, _ := orderedReader(t, q, nc)
	if n, err := r.Tries(ctx, 4); err != nil || n != 2 {
		t.Fatalf("tries under the former name: %d, %v; want 2", n, err)
	}
	if err := r.SetTries(ctx, 4, 3); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Tries(ctx, 4); err != nil || n != 3 {
		t.Fatalf("tries once stored by this release: %d, %v; want 3", n, err)
	}
	if err := r.ClearTries(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if keys, err := kv.Keys(ctx); !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatalf("entries left after the job was settled: %v, %v", keys, err)
	}
	// An entry only under the former name is cleared as well.
	if _, err := kv.Put(ctx, "demo.5", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := r.ClearTries(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "demo.5"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the former name's entry after clearing: %v", err)
	}
}

// TestTriesWithoutFormerEntriesReadOnce: with no entry of the lane under
// the former name when it starts, a job's count is one read of the bucket
// (a key's first job is read with it).
func TestTriesWithoutFormerEntriesReadOnce(t *testing.T) {
	srv, q, nc := deadQueue(t)
	r, _ := orderedReader(t, q, nc)
	ctx := context.Background()
	gets := countRequests(t, srv, "$JS.API.DIRECT.GET.KV_"+queue.TriesBucket+".>")
	if n, err := r.Tries(ctx, 7); err != nil || n != 0 {
		t.Fatalf("tries of a job with none: %d, %v", n, err)
	}
	if n := gets(); n != 1 {
		t.Fatalf("%d reads of the bucket, want 1", n)
	}
}

// TestTriesBucketEnsuredOnce: the lanes of one queue share the tries
// bucket: it is created or updated once, not once per lane at start.
func TestTriesBucketEnsuredOnce(t *testing.T) {
	srv, q, _ := deadQueue(t)
	creates := countRequests(t, srv, "$JS.API.STREAM.CREATE.KV_"+queue.TriesBucket)
	updates := countRequests(t, srv, "$JS.API.STREAM.UPDATE.KV_"+queue.TriesBucket)
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		s := spec()
		s.Name = name
		if err := q.EnsureLane(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if c, u := creates(), updates(); c+u != 1 {
		t.Fatalf("the tries bucket was created %d and updated %d times for three lanes, want once", c, u)
	}
}
