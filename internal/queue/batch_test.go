package queue_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/throttler/throttler/internal/queue"
)

// TestPublishBatch: one answer per job in order; a duplicate of a stored
// job and a job over max_backlog are told apart, and the jobs before the
// full lane stay stored (each job stands alone).
func TestPublishBatch(t *testing.T) {
	q, _ := newQueue(t, spec()) // max_backlog 3
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Job{ID: "a", Lane: "demo"}); err != nil {
		t.Fatal(err)
	}
	var jobs []queue.Job
	for _, id := range []string{"b", "a", "c", "d", "e"} {
		jobs = append(jobs, queue.Job{ID: id, Lane: "demo", Payload: []byte(id)})
	}
	res, err := q.PublishBatch(ctx, "demo", jobs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(jobs) {
		t.Fatalf("%d results for %d jobs", len(res), len(jobs))
	}
	if res[0].Err != nil || res[0].Duplicate || res[0].Seq != 2 {
		t.Errorf("b: %+v, want stored at 2", res[0])
	}
	if res[1].Err != nil || !res[1].Duplicate {
		t.Errorf("a again: %+v, want duplicate", res[1])
	}
	if res[2].Err != nil || res[2].Seq != 3 {
		t.Errorf("c: %+v, want stored at 3", res[2])
	}
	for i := 3; i < 5; i++ {
		if !errors.Is(res[i].Err, queue.ErrBacklogFull) {
			t.Errorf("%s: %+v, want ErrBacklogFull", jobs[i].ID, res[i])
		}
	}
	if n, err := q.Backlog(ctx, "demo", 0); err != nil || n != 3 {
		t.Fatalf("backlog %d %v, want 3", n, err)
	}
	if _, err := q.PublishBatch(ctx, "nope", jobs); !errors.Is(err, queue.ErrUnknownLane) {
		t.Fatalf("unknown lane: %v", err)
	}
}

// TestPublishBatchWindows: a batch longer than one window of asynchronous
// publishes is stored whole and in order.
func TestPublishBatchWindows(t *testing.T) {
	s := spec()
	s.MaxBacklog = 10_000
	q, _ := newQueue(t, s)
	jobs := make([]queue.Job, queue.MaxBatchWindow*2+5)
	for i := range jobs {
		jobs[i] = queue.Job{ID: "j" + strconv.Itoa(i), Lane: "demo", Payload: []byte("x")}
	}
	res, err := q.PublishBatch(context.Background(), "demo", jobs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Duplicate || r.Seq != uint64(i+1) {
			t.Fatalf("job %d: %+v, want stored at %d", i, r, i+1)
		}
	}
}
