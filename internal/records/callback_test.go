package records_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/testenv"
)

// sentCallbacks records what the store asks to send.
type sentCallbacks struct {
	mu   sync.Mutex
	sent []api.JobRecord
	lane []string
}

func (c *sentCallbacks) SendCallback(_ context.Context, lane string, rec api.JobRecord) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent, c.lane = append(c.sent, rec), append(c.lane, lane)
	return nil
}

// TestCallbackOnEverySettlement: a record naming a callback is sent, on
// its lane's callback lane, when a write settles it (delivered by Finish,
// cancelled, expired): not while it is retried, not for a second cancel,
// and never for a record without a callback; the drain meeting a
// cancelled job stores it again.
func TestCallbackOnEverySettlement(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, CallbackLane: "hooks"}); err != nil {
		t.Fatal(err)
	}
	cb := &sentCallbacks{}
	s.SetCallbacks(cb)
	now := time.Now().UTC()
	create := func(id, callback string) uint64 {
		rec := queued(id)
		rec.Callback = callback
		rev, _, err := s.Create(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	finish := func(id string, rev uint64, callback string, state api.JobState) {
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Hint: rev, Stored: now, Now: now, Callback: callback})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, c, func(r *api.JobRecord) { r.State = state }); err != nil {
			t.Fatal(err)
		}
	}
	// Retried, then delivered: one callback, with the final state.
	rev := create("d", "https://h.example/d")
	finish("d", rev, "https://h.example/d", api.StateRetrying)
	finish("d", 0, "https://h.example/d", api.StateDelivered)
	// Cancelled twice: one callback.
	create("c", "https://h.example/c")
	for range 2 {
		if _, err := s.Cancel(ctx, "demo", "c", now); err != nil {
			t.Fatal(err)
		}
	}
	// The drain meeting the cancelled job stores its callback again (a
	// repeat the callback lane's stream drops): the cancelling instance
	// may have stopped before it stored it.
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "c", Stored: now, Now: now}); !errors.Is(err, records.ErrNotStartable) {
		t.Fatalf("start of a cancelled job: %v", err)
	}
	// Expired by the scheduler.
	create("e", "https://h.example/e")
	if _, err := s.Mark(ctx, "demo", "e", api.StateExpired, "expired", now); err != nil {
		t.Fatal(err)
	}
	// No callback: nothing sent.
	rev = create("n", "")
	finish("n", rev, "", api.StateDelivered)

	want := []struct {
		id, url string
		state   api.JobState
	}{{"d", "https://h.example/d", api.StateDelivered}, {"c", "https://h.example/c", api.StateCancelled}, {"c", "https://h.example/c", api.StateCancelled}, {"e", "https://h.example/e", api.StateExpired}}
	if len(cb.sent) != len(want) {
		t.Fatalf("sent %d callbacks: %+v; want %d", len(cb.sent), cb.sent, len(want))
	}
	for i, w := range want {
		if r := cb.sent[i]; r.ID != w.id || r.Callback != w.url || r.State != w.state || cb.lane[i] != "hooks" {
			t.Errorf("callback %d: %+v on %s; want %s %s on hooks", i, r, cb.lane[i], w.id, w.state)
		}
	}
}

// BenchmarkLifecycleWithCallback: BenchmarkLifecycle with a callback: the
// settling write is followed by storing the callback job on the callback
// lane's stream (queue.Queue.SendCallback).
func BenchmarkLifecycleWithCallback(b *testing.B) {
	srv := testenv.StartNATS(b)
	nc, _ := testenv.JetStream(b, srv.ClientURL())
	s, err := records.New(nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, CallbackLane: "hooks"}); err != nil {
		b.Fatal(err)
	}
	q, err := queue.New(nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := q.EnsureRetries(ctx, queue.RetryConfig{MaxMsgs: 1000, MaxBytes: 1 << 20}); err != nil {
		b.Fatal(err)
	}
	if err := q.EnsureLane(ctx, queue.LaneSpec{Name: "hooks", MaxBacklog: 1 << 30, MaxInflight: 8, AckWait: 30 * time.Second,
		MaxBody: 1 << 20, DedupWindow: 2 * time.Minute}); err != nil {
		b.Fatal(err)
	}
	s.SetCallbacks(q)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := "bench-" + strconv.Itoa(i)
		now := time.Now().UTC()
		rev, _, err := s.Create(ctx, api.JobRecord{ID: id, Lane: "demo", State: api.StateQueued, StoredAt: &now, Callback: "https://h.example/cb/" + id})
		if err != nil {
			b.Fatal(err)
		}
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Hint: rev, Stored: now, Now: now, Callback: "https://h.example/cb/" + id})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Finish(ctx, c, func(r *api.JobRecord) {
			r.State, r.FinishedAt = api.StateDelivered, &now
			r.Attempts = append(r.Attempts, api.JobAttempt{At: now, Status: 200, DurationMillis: 1.5})
			r.Response = &api.JobResponse{Status: 200, Headers: map[string]string{"Content-Type": "application/json"}, Body: `{"ok":true}`}
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if d, err := q.Depth(ctx, "hooks"); err != nil || d.Stored != uint64(b.N) {
		b.Fatalf("the callback lane holds %d jobs (%v); want %d", d.Stored, err, b.N)
	}
}
