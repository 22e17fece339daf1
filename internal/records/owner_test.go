package records_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/records"
)

// TestViewerSees: a viewer of all sees every record; a key sees its own
// only, never one without an owner; the zero viewer sees nothing.
func TestViewerSees(t *testing.T) {
	for _, tc := range []struct {
		v     records.Viewer
		owner string
		sees  bool
	}{
		{records.Everyone, "", true},
		{records.Everyone, "a", true},
		{records.Viewer{Key: "a"}, "a", true},
		{records.Viewer{Key: "a"}, "b", false},
		{records.Viewer{Key: "a"}, "", false},
		{records.Viewer{All: true, Key: "ops"}, "a", true},
		{records.Viewer{}, "", false},
		{records.Viewer{}, "a", false},
	} {
		if got := tc.v.Sees(api.JobRecord{Owner: tc.owner}); got != tc.sees {
			t.Errorf("%+v sees a record of owner %q: %v, want %v", tc.v, tc.owner, got, tc.sees)
		}
	}
}

// TestRecordsOfAKey: Recent lists a key's own records only, up to limit
// even when other keys' records are newer; Cancel and CancelStored of a
// record the viewer does not see are ErrNotFound and change nothing; the
// claim of a job stored without a record writes the job's owner, and a
// claim never changes the owner of a record that has one.
func TestRecordsOfAKey(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	now := time.Now().UTC()
	own := func(id, owner string) api.JobRecord {
		rec := queued(id)
		rec.Owner = owner
		return rec
	}
	for i := range 3 {
		if _, _, err := s.Create(ctx, own(fmt.Sprintf("a-%d", i), "a")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		if _, _, err := s.Create(ctx, own(fmt.Sprintf("b-%d", i), "b")); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Create(ctx, own("nats", "")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v     records.Viewer
		limit int
		want  []string
	}{
		{records.Viewer{Key: "a"}, 2, []string{"a-2", "a-1"}},
		{records.Viewer{Key: "a"}, 10, []string{"a-2", "a-1", "a-0"}},
		{records.Viewer{Key: "b"}, 1, []string{"b-19"}},
		{records.Viewer{Key: "c"}, 10, nil},
		{records.Everyone, 2, []string{"nats", "b-19"}},
	} {
		recs, err := s.Recent(ctx, "demo", tc.v, "", tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.ID)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Recent for %+v, limit %d: %v, want %v", tc.v, tc.limit, got, tc.want)
		}
	}

	if rec, err := s.Cancel(ctx, "demo", "a-0", records.Viewer{Key: "b"}, now); !errors.Is(err, records.ErrNotFound) || rec.ID != "" {
		t.Fatalf("b cancels a's job: %+v, %v; want ErrNotFound and nothing of it", rec, err)
	}
	if rec, _, _ := s.Get(ctx, "demo", "a-0"); rec.State != api.StateQueued {
		t.Fatalf("a's job after b's cancel: %+v", rec)
	}
	if _, err := s.Cancel(ctx, "demo", "a-0", records.Viewer{Key: "a"}, now); err != nil {
		t.Fatalf("a cancels its job: %v", err)
	}
	if _, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "stored-a", Owner: "a", Stored: now}, records.Viewer{Key: "b"}, now); !errors.Is(err, records.ErrNotFound) {
		t.Fatalf("b cancels a's stored job: %v", err)
	}
	if _, _, err := s.Get(ctx, "demo", "stored-a"); !errors.Is(err, records.ErrNotFound) {
		t.Fatalf("b's refused cancel left a record: %v", err)
	}
	if rec, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "stored-a2", Owner: "a", Stored: now}, records.Viewer{Key: "a"}, now); err != nil || rec.Owner != "a" {
		t.Fatalf("a cancels its stored job: %+v, %v", rec, err)
	}

	// A claim creating the record (Fresh, and after a lost race) writes
	// the job's owner.
	for _, fresh := range []bool{true, false} {
		id := fmt.Sprintf("seq-%v", fresh)
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Fresh: fresh, Stored: now, Now: now, Owner: "a"})
		if err != nil || c.Record.Owner != "a" {
			t.Fatalf("claim of %s: %+v, %v; want owner a", id, c.Record, err)
		}
		if rec, _, _ := s.Get(ctx, "demo", id); rec.Owner != "a" {
			t.Fatalf("record of %s: owner %q, want a", id, rec.Owner)
		}
	}
	// A claim meeting another caller's record under the job's id (a
	// record without an owner, or b's, even cancelled) takes nothing of
	// it: ErrOtherOwner, and the record is as it was.
	before, _, _ := s.Get(ctx, "demo", "nats")
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "nats", Stored: now, Now: now, Owner: "a"}); !errors.Is(err, records.ErrOtherOwner) {
		t.Fatalf("claim by a's job of a record without an owner: %v; want ErrOtherOwner", err)
	}
	if after, _, _ := s.Get(ctx, "demo", "nats"); after.State != before.State || after.Owner != "" {
		t.Fatalf("the record without an owner after a's claim: %+v, was %+v", after, before)
	}
	if _, _, err := s.Create(ctx, api.JobRecord{ID: "taken", Lane: "demo", State: api.StateQueued, StoredAt: &now, Attempts: []api.JobAttempt{}, Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(ctx, "demo", "taken", records.Viewer{Key: "b"}, now); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"", "a"} {
		if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "taken", Stored: now, Now: now, Owner: owner}); !errors.Is(err, records.ErrOtherOwner) {
			t.Fatalf("claim by a job of owner %q of b's cancelled record: %v; want ErrOtherOwner, not a cancel", owner, err)
		}
	}
}

// TestQueuedRecord: the record of a job waiting without one carries what
// its claim will keep: its owner, and its reply subject only when the
// lane allows it.
func TestQueuedRecord(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	replies, err := records.NewReplies(records.ReplyRules{Prefixes: []string{"replies"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "shop", Keep: time.Hour, MaxRecord: 1 << 20, Replies: replies}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, tc := range []struct {
		lane, reply, want string
	}{
		{"shop", "replies.x.1", "replies.x.1"},
		{"shop", "elsewhere.1", ""},
		{"demo", "replies.x.1", ""}, // the lane lists no reply subjects
	} {
		rec := s.Queued(records.Waiting{Lane: tc.lane, ID: "j", Key: "k", Reply: tc.reply, Owner: "a", Stored: now})
		if rec.State != api.StateQueued || rec.Reply != tc.want || rec.Owner != "a" || rec.Key != "k" || rec.ID != "j" ||
			rec.Lane != tc.lane || rec.V != api.JobRecordVersion || rec.StoredAt == nil || !rec.StoredAt.Equal(now) || rec.Attempts == nil {
			t.Errorf("%s, reply %s: %+v; want queued, reply %q, owner a", tc.lane, tc.reply, rec, tc.want)
		}
	}
}

// TestWaitHearsOnlyWhatTheViewerSees: a wait hears only records its
// viewer sees. A key's record can go (results.keep passes while its job
// still waits in the lane) and another key's job take its id; a request of
// the first key still waiting on that id must not be answered the other
// job's record, neither from a poll nor from the instance's wait subject.
func TestWaitHearsOnlyWhatTheViewerSees(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	now := time.Now().UTC()
	rec := queued("taken")
	rec.Owner = "b"
	rev, _, err := s.Create(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "taken", Hint: rev, Stored: now, Now: now, Owner: "b"})
	if err != nil {
		t.Fatal(err)
	}
	settled, err := s.Finish(ctx, c, func(r *api.JobRecord) {
		r.State, r.FinishedAt = api.StateDelivered, &now
		r.Response = &api.JobResponse{Status: 200, Body: "b's answer"}
	})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan api.JobRecord, 1)
	ch <- settled
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	got, ok := s.Wait(wctx, ch, "demo", "taken", records.Viewer{Key: "a"}, 20*time.Millisecond)
	if ok || got.ID != "" || got.Response != nil {
		t.Fatalf("a's wait on an id b's record holds: %+v, settled %v; want nothing of it", got, ok)
	}
	// b, and an admin, hear it.
	for _, v := range []records.Viewer{{Key: "b"}, {All: true, Key: "ops"}} {
		got, ok := s.Wait(ctx, nil, "demo", "taken", v, 20*time.Millisecond)
		if !ok || got.Response == nil || got.Response.Body != "b's answer" {
			t.Fatalf("wait of %+v: %+v, %v; want b's settled record", v, got, ok)
		}
	}
}
