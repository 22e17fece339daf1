package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/queue"
)

// aheadLane makes keyed lane demo and stores jobs on it in the order given
// (each "key/id"), and returns its reader and the jobs' stream sequences.
func aheadLane(t *testing.T, q *queue.Queue, jobs ...string) (*queue.KeyedReader, map[string]uint64) {
	t.Helper()
	ctx := context.Background()
	if err := q.EnsureKeyedLane(ctx, intakeSpec(100)); err != nil {
		t.Fatal(err)
	}
	seqs := map[string]uint64{}
	for _, kj := range jobs {
		var key, id string
		if _, err := fmt.Sscanf(kj, "%1s/%s", &key, &id); err != nil {
			t.Fatal(err)
		}
		ack, err := q.Publish(ctx, queue.Job{ID: id, Lane: "demo", Key: key, Payload: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = ack.Seq
	}
	r, err := q.KeyedReader("demo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, seqs
}

// nextID reads key's next job at or after from and returns its id ("" none).
func nextID(t *testing.T, r *queue.KeyedReader, key string, from uint64) string {
	t.Helper()
	m, err := r.Next(context.Background(), key, from)
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return ""
	}
	return m.Job().ID
}

// TestKeyedReadAheadAcrossKeys: one request reads the heads of every key
// (a batch direct get across the lane's subjects), and the keys' later
// jobs come out of it in order, each key's at its own cursor.
func TestKeyedReadAheadAcrossKeys(t *testing.T) {
	t.Parallel()
	q, _ := newBareQueue(t)
	r, seq := aheadLane(t, q, "a/a1", "b/b1", "a/a2", "c/c1", "b/b2", "a/a3")
	steps := []struct {
		key  string
		from uint64
		want string
	}{
		{"a", 0, "a1"},
		{"b", 1, "b1"},
		{"c", 0, "c1"},
		{"a", seq["a1"] + 1, "a2"},
		{"b", seq["b1"] + 1, "b2"},
		{"a", seq["a2"] + 1, "a3"},
	}
	for i, s := range steps {
		if got := nextID(t, r, s.key, s.from); got != s.want {
			t.Fatalf("step %d: %s's next from %d = %q, want %q", i, s.key, s.from, got, s.want)
		}
	}
	if n := queue.AheadScans(r); n != 1 {
		t.Fatalf("%d reads ahead for 6 jobs of 3 keys, want 1", n)
	}
	// Past the last job read, each read asks the server again: a job
	// stored since must be found.
	if got := nextID(t, r, "c", seq["c1"]+1); got != "" {
		t.Fatalf("c's next after c1: %q, want none", got)
	}
	if _, err := q.Publish(context.Background(), queue.Job{ID: "c2", Lane: "demo", Key: "c", Payload: []byte("c2")}); err != nil {
		t.Fatal(err)
	}
	if got := nextID(t, r, "c", seq["c1"]+1); got != "c2" {
		t.Fatalf("c's next after c1, c2 stored since: %q, want c2", got)
	}
	if got := nextID(t, r, "d", 0); got != "" {
		t.Fatalf("d's first job: %q, want none", got)
	}
}

// TestKeyedReadAheadDeletedInBetween: a job deleted before the lane is
// read ahead is not in the read; one settled here after it is never
// answered again; a key given up (Settling) whose next job another
// instance then settles is read afresh, not from what was read before.
func TestKeyedReadAheadDeletedInBetween(t *testing.T) {
	t.Parallel()
	q, nc := newBareQueue(t)
	r, seq := aheadLane(t, q, "a/a1", "a/a2", "a/a3", "a/a4", "b/b1", "b/b2")
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, queue.StreamName("demo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, seq["a2"]); err != nil {
		t.Fatal(err)
	}
	if got := nextID(t, r, "a", 0); got != "a1" {
		t.Fatalf("a's first job %q, want a1", got)
	}
	if got := nextID(t, r, "a", seq["a1"]+1); got != "a3" {
		t.Fatalf("a's next after a1 with a2 deleted before the read: %q, want a3", got)
	}
	// a3 settled here: never answered again, even from its own sequence.
	m, err := r.Next(ctx, "a", seq["a3"])
	if err != nil || m == nil {
		t.Fatalf("a3: %v, %v", m, err)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if got := nextID(t, r, "a", seq["a3"]); got != "a4" {
		t.Fatalf("a's next from a3's sequence after a3 settled: %q, want a4", got)
	}
	// b is given up; another instance settles b1 meanwhile.
	if got := nextID(t, r, "b", 0); got != "b1" {
		t.Fatalf("b's first job %q, want b1", got)
	}
	if err := r.Settling(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, seq["b1"]); err != nil {
		t.Fatal(err)
	}
	if got := nextID(t, r, "b", 0); got != "b2" {
		t.Fatalf("b's first job once b1 was settled elsewhere: %q, want b2", got)
	}
	if n := queue.AheadScans(r); n != 1 {
		t.Fatalf("%d reads ahead, want 1", n)
	}
	r.WaitDeletes()
}

// TestKeyedReadAheadKeysNotHeld: the jobs of a key this instance did not
// hold since before a read ahead are not kept from it (another instance
// may settle them): the key is read by itself once taken, and sees what
// was settled since.
func TestKeyedReadAheadKeysNotHeld(t *testing.T) {
	t.Parallel()
	q, nc := newBareQueue(t)
	r, seq := aheadLane(t, q, "a/a1", "b/b1", "b/b2")
	// a is held from before the read; b only from after it.
	held := map[string]time.Time{"a": time.Now()}
	r.Holds = func(key string, since time.Time) bool {
		at, ok := held[key]
		return ok && at.Before(since)
	}
	if got := nextID(t, r, "a", 0); got != "a1" {
		t.Fatalf("a's first job %q, want a1", got)
	}
	// Another instance settles b1; then b is taken here.
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, queue.StreamName("demo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, seq["b1"]); err != nil {
		t.Fatal(err)
	}
	held["b"] = time.Now()
	if got := nextID(t, r, "b", 0); got != "b2" {
		t.Fatalf("b's first job, taken after the read ahead: %q, want b2", got)
	}
}

// TestKeyedReadAheadStale: what was read ahead is trusted for a while only:
// then the lane is read again from the asking key's cursor.
func TestKeyedReadAheadStale(t *testing.T) {
	t.Parallel()
	q, _ := newBareQueue(t)
	r, seq := aheadLane(t, q, "a/a1", "a/a2", "b/b1")
	if got := nextID(t, r, "a", 0); got != "a1" {
		t.Fatalf("a's first job %q, want a1", got)
	}
	queue.AgeAhead(r)
	if got := nextID(t, r, "a", seq["a1"]+1); got != "a2" {
		t.Fatalf("a's next after a stale read ahead: %q, want a2", got)
	}
	if got := nextID(t, r, "b", 0); got != "b1" {
		t.Fatalf("b's first job %q, want b1", got)
	}
	if n := queue.AheadScans(r); n != 2 {
		t.Fatalf("%d reads ahead, want 2 (the first one stale)", n)
	}
}

// TestKeyedReadAheadServerWithoutBatch: a server that answers a read
// ahead with one message and no batch headers (before nats-server 2.11)
// makes the reader read each key by itself, with the same answers.
func TestKeyedReadAheadServerWithoutBatch(t *testing.T) {
	t.Parallel()
	q, _ := newBareQueue(t)
	r, seq := aheadLane(t, q, "a/a1", "b/b1", "a/a2")
	queue.SetScanBatch(r, 0)
	steps := []struct {
		key  string
		from uint64
		want string
	}{
		{"a", 0, "a1"},
		{"b", 0, "b1"},
		{"a", seq["a1"] + 1, "a2"},
		{"a", seq["a2"] + 1, ""},
	}
	for i, s := range steps {
		if got := nextID(t, r, s.key, s.from); got != s.want {
			t.Fatalf("step %d: %s's next from %d = %q, want %q", i, s.key, s.from, got, s.want)
		}
	}
	if n := queue.AheadScans(r); n != 0 {
		t.Fatalf("%d reads ahead answered by a server without batches, want 0", n)
	}
}

// TestKeyedReadAheadBounded: a lane with more jobs than one request reads
// is read ahead a request at a time, in order, and every key's job is
// found.
func TestKeyedReadAheadBounded(t *testing.T) {
	t.Parallel()
	q, _ := newBareQueue(t)
	var jobs []string
	for i := range 40 {
		jobs = append(jobs, fmt.Sprintf("%c/j%d", 'a'+i%20, i))
	}
	r, _ := aheadLane(t, q, jobs...)
	queue.SetScanBatch(r, 8)
	for i := range 20 {
		key := string(rune('a' + i))
		if got, want := nextID(t, r, key, 0), fmt.Sprintf("j%d", i); got != want {
			t.Fatalf("%s's first job %q, want %q", key, got, want)
		}
	}
	if n := queue.AheadScans(r); n != 3 {
		t.Fatalf("%d reads ahead of 8 for 20 heads, want 3", n)
	}
}

// TestKeyedReadAheadFreshKeyBehindBacklog: a key whose only job lies
// behind another key's long backlog is read after one scan at most, not
// after scans of the whole backlog.
func TestKeyedReadAheadFreshKeyBehindBacklog(t *testing.T) {
	t.Parallel()
	q, _ := newBareQueue(t)
	var jobs []string
	for i := range 60 {
		jobs = append(jobs, fmt.Sprintf("h/h%d", i))
	}
	r, _ := aheadLane(t, q, append(jobs, "f/f0")...)
	queue.SetScanBatch(r, 8)
	if got := nextID(t, r, "f", 0); got != "f0" {
		t.Fatalf("f's first job %q, want f0", got)
	}
	if n := queue.AheadScans(r); n != 1 {
		t.Fatalf("%d reads ahead for a key behind 60 jobs of another, want 1", n)
	}
	if got := nextID(t, r, "h", 0); got != "h0" {
		t.Fatalf("h's first job %q, want h0", got)
	}
}

// TestKeyedReadAheadConfirmedAck: a job settled with a confirmed ack (its
// retry or dead letter stored first) leaves what was read ahead: a read
// from before it, after an earlier job of its key went back, does not
// answer it again.
func TestKeyedReadAheadConfirmedAck(t *testing.T) {
	t.Parallel()
	q, _ := newBareQueue(t)
	r, seq := aheadLane(t, q, "a/a1", "a/a2", "a/a3")
	ctx := context.Background()
	if got := nextID(t, r, "a", 0); got != "a1" {
		t.Fatalf("a's first job %q, want a1", got)
	}
	m, err := r.Next(ctx, "a", seq["a1"]+1)
	if err != nil || m == nil || m.Job().ID != "a2" {
		t.Fatalf("a's next after a1: %v, %v; want a2", m, err)
	}
	if err := m.AckSync(ctx); err != nil {
		t.Fatal(err)
	}
	// a1 went back (its cursor moves back to it); a2 is gone.
	if got := nextID(t, r, "a", seq["a1"]+1); got != "a3" {
		t.Fatalf("a's next after a1 with a2 settled: %q, want a3", got)
	}
	if n := queue.AheadScans(r); n != 1 {
		t.Fatalf("%d reads ahead, want 1", n)
	}
}
