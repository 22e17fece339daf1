package records_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
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

// prefixes are callback URL prefixes (results.callback_urls).
func prefixes(t testing.TB, urls ...string) *dest.Prefixes {
	t.Helper()
	p, err := dest.NewPrefixes(urls)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCallbackOnEverySettlement: a record naming a callback is sent, on
// its lane's callback lane, when a write settles it (delivered by Finish,
// cancelled, expired): not while it is retried, not for a second cancel,
// never for a record without a callback, and never to a URL outside the
// lane's results.callback_urls as they are now; the drain meeting a
// cancelled job stores it again.
func TestCallbackOnEverySettlement(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, CallbackLane: "hooks",
		CallbackURLs: prefixes(t, "https://h.example/")}); err != nil {
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
		if _, err := s.Cancel(ctx, "demo", "c", records.Everyone, now); err != nil {
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
	// A callback under a prefix the lane no longer lists (it was
	// removed since the job was stored): nothing sent.
	rev = create("gone", "https://old.example/gone")
	finish("gone", rev, "https://old.example/gone", api.StateDelivered)

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
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, CallbackLane: "hooks",
		CallbackURLs: prefixes(b, "https://h.example/cb/")}); err != nil {
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

// TestReplayingPutsTheRecordBack: a job replayed from the dead letters
// gets its record back to queued before it is stored again: a dead
// record, an expired one (whose claim would otherwise drop the job) and a
// record that is gone. The claim then starts it; its settled record names
// the replay (replays, and replayed_from: the dead letter's sequence),
// keeps the attempts before it and the callback the dead letter kept, and
// its callback is sent again, under an id no other settlement's callback
// has: also when the record went between two replays (its replays count
// starts again) or before the replayed job's claim (which makes it again,
// from the dead letter's sequence the job carries). undo puts a record
// back as it was. A cancelled job stays cancelled.
func TestReplayingPutsTheRecordBack(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, CallbackLane: "hooks",
		CallbackURLs: prefixes(t, "https://h.example/")}); err != nil {
		t.Fatal(err)
	}
	cb := &sentCallbacks{}
	s.SetCallbacks(cb)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const url = "https://h.example/d"

	// Dead after one attempt.
	rec := queued("d")
	rec.Callback = url
	rev, _, err := s.Create(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "d", Hint: rev, Stored: t0, Now: t0, Callback: url})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, c, func(r *api.JobRecord) {
		r.State, r.Reason, r.FinishedAt = api.StateDead, "rejected by target", &t0
		r.Attempts = append(r.Attempts, api.JobAttempt{At: t0, Status: 400})
		r.Response = &api.JobResponse{Status: 400}
	}); err != nil {
		t.Fatal(err)
	}
	// Expired before it started.
	if _, err := s.Mark(ctx, "demo", "e", api.StateExpired, "expired", t0); err != nil {
		t.Fatal(err)
	}

	// purge drops a record, as results.keep does.
	purge := func(id string) {
		t.Helper()
		_, rev, err := s.Get(ctx, "demo", id)
		if err == nil {
			err = s.Undo(ctx, "demo", id, rev)
		}
		if err != nil {
			t.Fatalf("purging %s's record: %v", id, err)
		}
	}
	steps := []struct {
		id, callback string
		seq          uint64 // the dead letter's
		replays      int
		end          api.JobState
		gone         string // the record goes: "before" the replay, before its "claim"
	}{
		{"d", url, 11, 1, api.StateDead, ""},         // dead: replayed, dies again
		{"e", "", 12, 1, api.StateDelivered, ""},     // expired
		{"gone", url, 13, 1, api.StateDelivered, ""}, // no record: a new one
		{"d", url, 14, 2, api.StateDead, ""},         // replayed again, dies again
		{"d", url, 15, 1, api.StateDead, "before"},   // its count starts again
		{"d", url, 16, 2, api.StateDelivered, "claim"},
	}
	for i, st := range steps {
		if st.gone == "before" {
			purge(st.id)
		}
		undo, err := s.Replaying(ctx, records.Replay{Lane: "demo", ID: st.id, Callback: st.callback, Seq: st.seq}, t0.Add(time.Minute))
		if err != nil {
			t.Fatalf("step %d: replaying %s: %v", i, st.id, err)
		}
		if undo == nil {
			t.Fatalf("step %d: no undo", i)
		}
		got, _, err := s.Get(ctx, "demo", st.id)
		if err != nil || got.State != api.StateQueued || got.Replays != st.replays || got.ReplayedFrom != st.seq || got.FinishedAt != nil ||
			got.Response != nil || got.Reason != "" || got.Callback != st.callback {
			t.Fatalf("step %d: %s after its replay: %+v, %v; want queued, replays %d from #%d, no end, callback %q", i, st.id, got, err,
				st.replays, st.seq, st.callback)
		}
		replays := st.replays
		if st.gone == "claim" {
			purge(st.id)
			replays = 0
		}
		// The drain's claim of the stored copy (Fresh, no hint) starts it.
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: st.id, Fresh: true, Stored: t0, Now: t0.Add(time.Minute),
			Callback: st.callback, ReplayedFrom: st.seq})
		if err != nil {
			t.Fatalf("step %d: claim of replayed %s: %v", i, st.id, err)
		}
		end, err := s.Finish(ctx, c, func(r *api.JobRecord) {
			r.State = st.end
			r.Attempts = append(r.Attempts, api.JobAttempt{At: t0, Status: 200})
		})
		if err != nil || end.Replays != replays || end.ReplayedFrom != st.seq {
			t.Fatalf("step %d: %s settled: %+v, %v; want replays %d from #%d", i, st.id, end, err, replays, st.seq)
		}
		if i == 0 && len(end.Attempts) != 2 {
			t.Fatalf("the replayed record lost the attempts before the replay: %+v", end.Attempts)
		}
	}
	// One callback per settlement, each replay's under an id of its own,
	// the record kept or not.
	var sent []string
	ids := map[string]bool{}
	for _, r := range cb.sent {
		id := queue.CallbackID(r)
		sent = append(sent, r.ID+" "+string(r.State)+" "+id)
		if ids[id] {
			t.Errorf("callback id %s sent for two settlements", id)
		}
		ids[id] = true
	}
	want := []string{
		"d dead demo.d.callback", "d dead demo.d.callback-11", "gone delivered demo.gone.callback-13",
		"d dead demo.d.callback-14", "d dead demo.d.callback-15", "d delivered demo.d.callback-16",
	}
	if strings.Join(sent, "|") != strings.Join(want, "|") {
		t.Fatalf("callbacks:\n%s\nwant\n%s", strings.Join(sent, "\n"), strings.Join(want, "\n"))
	}

	// A cancelled job stays cancelled (a job cancelled after its expiry
	// passed is dead-lettered as expired before the drain meets the
	// cancel): its replayed copy is dropped by the claim.
	now := time.Now().UTC()
	if _, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "cancelled", Stored: now}, records.Everyone, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Replaying(ctx, records.Replay{Lane: "demo", ID: "cancelled"}, now); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx, "demo", "cancelled"); err != nil || got.State != api.StateCancelled || got.Replays != 0 {
		t.Fatalf("a cancelled job's record after a replay: %+v, %v; want cancelled", got, err)
	}
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "cancelled", Fresh: true, Stored: now, Now: now}); !errors.Is(err, records.ErrNotStartable) {
		t.Fatalf("claim of a replayed cancelled job: %v, want ErrNotStartable", err)
	}

	// undo: the record as it was, or none when the replay made it.
	before, _, _ := s.Get(ctx, "demo", "d")
	undo, err := s.Replaying(ctx, records.Replay{Lane: "demo", ID: "d", Callback: url}, t0)
	if err != nil {
		t.Fatal(err)
	}
	undo()
	if after, _, err := s.Get(ctx, "demo", "d"); err != nil || after.State != before.State || after.Replays != before.Replays {
		t.Fatalf("undone replay: %+v, %v; want %+v", after, err, before)
	}
	undo, err = s.Replaying(ctx, records.Replay{Lane: "demo", ID: "new"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	undo()
	if _, _, err := s.Get(ctx, "demo", "new"); !errors.Is(err, records.ErrNotFound) {
		t.Fatalf("undone replay of a job without a record: %v; want no record", err)
	}
}

// TestReplayingKeepsTheKeyItStores: a replay that gives the job another
// key (a dead letter replayed with ?key=) stores it under that key, and its
// record, kept from before, says so: GET, the settled record and its
// callback name the key the job was delivered with.
func TestReplayingKeepsTheKeyItStores(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	now := time.Now().UTC()
	if _, _, err := s.Create(ctx, api.JobRecord{ID: "k", Lane: "demo", Key: "old", State: api.StateDead, StoredAt: &now, Attempts: []api.JobAttempt{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Replaying(ctx, records.Replay{Lane: "demo", ID: "k", Key: "new", Seq: 7}, now); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx, "demo", "k"); err != nil || got.Key != "new" || got.State != api.StateQueued {
		t.Fatalf("the record after a replay with key new: %+v, %v; want key new, queued", got, err)
	}
}
