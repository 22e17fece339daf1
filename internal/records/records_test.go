package records_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/testenv"
)

func newStore(t testing.TB, keep time.Duration) *records.Store {
	t.Helper()
	nc, _ := testenv.JetStream(t, natsURL(t))
	s, err := records.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureLane(context.Background(), records.LaneSpec{Name: "demo", Keep: keep, MaxRecord: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	return s
}

// natsURL is an in-process nats-server's, started for t; a benchmark takes
// THROTTLER_BENCH_NATS_URL instead when it is set (a nats-server of its own
// process: the benchmark's CPU figures are then the client's alone).
func natsURL(t testing.TB) string {
	if u := os.Getenv("THROTTLER_BENCH_NATS_URL"); u != "" {
		if _, ok := t.(*testing.B); ok {
			return u
		}
	}
	return testenv.StartNATS(t).ClientURL()
}

func queued(id string) api.JobRecord {
	now := time.Now().UTC()
	return api.JobRecord{ID: id, Lane: "demo", State: api.StateQueued, StoredAt: &now}
}

// TestCreateIfAbsent: a second create of the same id finds the first
// record (an Idempotency-Key that lasts as long as the record), whatever
// the id's characters.
func TestCreateIfAbsent(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	for _, id := range []string{"order-1", "a.b*c>d/e", "~!#"} {
		rev, _, err := s.Create(ctx, queued(id))
		if err != nil || rev == 0 {
			t.Fatalf("%s: create: rev %d, %v", id, rev, err)
		}
		_, old, err := s.Create(ctx, queued(id))
		if !errors.Is(err, records.ErrExists) || old.ID != id || old.State != api.StateQueued {
			t.Fatalf("%s: second create: %+v, %v; want ErrExists with the first record", id, old, err)
		}
	}
	if _, _, err := s.Get(ctx, "demo", "never"); !errors.Is(err, records.ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}
}

// TestCancelRacesStart: a cancel and a claim of the same queued job race
// from many goroutines; exactly one wins each pair, never both.
func TestCancelRacesStart(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	const pairs = 200
	var mu sync.Mutex
	cancelled, started := 0, 0
	for i := range pairs {
		id := "job-" + string(rune('a'+i%26)) + time.Now().Format("150405.000000000")
		rev, _, err := s.Create(ctx, queued(id))
		if err != nil {
			t.Fatal(err)
		}
		c := oneWins(t, id,
			func() error { _, err := s.Cancel(ctx, "demo", id, records.Everyone, time.Now()); return err },
			func() error {
				_, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Hint: rev, Stored: time.Now(), Now: time.Now()})
				return err
			})
		rec, _, err := s.Get(ctx, "demo", id)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]api.JobState{true: api.StateCancelled, false: api.StateInFlight}[c]; rec.State != want {
			t.Fatalf("%s: state %s, want %s", id, rec.State, want)
		}
		mu.Lock()
		if c {
			cancelled++
		} else {
			started++
		}
		mu.Unlock()
	}
	t.Logf("%d pairs: %d cancelled, %d started", pairs, cancelled, started)
}

// TestCancelStoredRacesFreshStart: a job stored without a record (an id
// intake made) is cancelled while the drain claims it: both create the
// record, and exactly one wins.
func TestCancelStoredRacesFreshStart(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	for i := range 100 {
		id := "abcdefghijk." + strconv.Itoa(i+1)
		oneWins(t, id,
			func() error {
				_, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: id, Stored: time.Now()}, records.Everyone, time.Now())
				return err
			},
			func() error {
				_, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Fresh: true, Stored: time.Now(), Now: time.Now()})
				return err
			})
	}
}

// TestCancelOfANATSJobRacesItsClaim: a job published over NATS has no
// record until the drain claims it. A cancel (CancelStored, create-only)
// races the drain's first claim (Fresh: a create) and a claim of a
// delivery made again (not Fresh: read, then create): exactly one wins
// each time, and a lost claim is ErrNotStartable.
func TestCancelOfANATSJobRacesItsClaim(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	for i := range 100 {
		id := "nats-" + strconv.Itoa(i)
		fresh := i%2 == 0
		cancelled := oneWins(t, id,
			func() error {
				_, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: id, Reply: "replies.x", Stored: time.Now()}, records.Everyone, time.Now())
				return err
			},
			func() error {
				_, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Fresh: fresh, Stored: time.Now(), Now: time.Now(), Reply: "replies.x"})
				return err
			})
		rec, _, err := s.Get(ctx, "demo", id)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]api.JobState{true: api.StateCancelled, false: api.StateInFlight}[cancelled]; rec.State != want {
			t.Fatalf("%s: state %s, want %s", id, rec.State, want)
		}
		// The loser tries again (JetStream delivers the job once more,
		// the caller repeats the cancel): the outcome stands.
		if cancelled {
			if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Stored: time.Now(), Now: time.Now()}); !errors.Is(err, records.ErrNotStartable) {
				t.Fatalf("%s: a claim after the cancel: %v, want ErrNotStartable", id, err)
			}
		} else if _, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: id, Stored: time.Now()}, records.Everyone, time.Now()); !errors.Is(err, records.ErrStarted) {
			t.Fatalf("%s: a cancel after the claim: %v, want ErrStarted", id, err)
		}
	}
}

// TestStartAfterSettleAndCancelAfterStart steps one job through its states.
func TestStartAfterSettleAndCancelAfterStart(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rev, _, err := s.Create(ctx, queued("j"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "j", Hint: rev, Stored: t0, Now: t0.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(ctx, "demo", "j", records.Everyone, t0); !errors.Is(err, records.ErrStarted) {
		t.Fatalf("cancel of a started job: %v, want ErrStarted", err)
	}
	rec, err := s.Finish(ctx, c, func(r *api.JobRecord) {
		r.State = api.StateDelivered
		r.Attempts = append(r.Attempts, api.JobAttempt{At: t0, Status: 200})
	})
	if err != nil || rec.State != api.StateDelivered || len(rec.Attempts) != 1 {
		t.Fatalf("finish: %+v, %v", rec, err)
	}
	if _, err := s.Mark(ctx, "demo", "j", api.StateExpired, "expired", t0); !errors.Is(err, records.ErrStarted) {
		t.Fatalf("expiry of a delivered job: %v, want ErrStarted", err)
	}
	// A scheduled job expires; its claim then fails.
	if _, err := s.Mark(ctx, "demo", "later", api.StateScheduled, "", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mark(ctx, "demo", "later", api.StateExpired, "expired", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "later", Fresh: true, Stored: t0, Now: t0}); !errors.Is(err, records.ErrNotStartable) {
		t.Fatalf("start of an expired job: %v, want ErrNotStartable", err)
	}
}

// TestRecordsGoneAfterKeep: a record outlives nothing past its lane's keep.
func TestRecordsGoneAfterKeep(t *testing.T) {
	s := newStore(t, time.Second)
	ctx := context.Background()
	if _, _, err := s.Create(ctx, queued("short")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "demo", "short"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the record is gone after keep", func() bool {
		_, _, err := s.Get(ctx, "demo", "short")
		return errors.Is(err, records.ErrNotFound)
	})
	// Gone means the key is free again.
	if _, _, err := s.Create(ctx, queued("short")); err != nil {
		t.Fatalf("create after keep: %v", err)
	}
}

// TestWaitAddress: only a wait subject is ever published to.
func TestWaitAddress(t *testing.T) {
	for _, s := range []struct {
		in   string
		want bool
	}{
		{records.WaitSubject("inst-1"), true},
		{"throttler.records.", false},
		{"throttler.records.a.b", false},
		{"_INBOX.x", false},
		{"throttler.records.a>", false},
	} {
		if got := records.WaitAddress(s.in) != ""; got != s.want {
			t.Errorf("WaitAddress(%q) kept %v, want %v", s.in, got, s.want)
		}
	}
}

// TestCreateAfterUndo: a record intake undid (its job could not be stored)
// leaves a purge marker; a new create of the same id, and a fresh claim of
// a job of that id, write over it.
func TestCreateAfterUndo(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	for i, fresh := range []bool{false, true} {
		id := "undone-" + strconv.Itoa(i)
		rev, _, err := s.Create(ctx, queued(id))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Undo(ctx, "demo", id, rev); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Get(ctx, "demo", id); !errors.Is(err, records.ErrNotFound) {
			t.Fatalf("%s after undo: %v, want ErrNotFound", id, err)
		}
		now := time.Now().UTC()
		if fresh {
			c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Fresh: true, Stored: now, Now: now})
			if err != nil || c.Record.State != api.StateInFlight || c.Rev <= rev {
				t.Fatalf("%s: fresh claim over the marker: %+v, %v", id, c, err)
			}
		} else if rev2, _, err := s.Create(ctx, queued(id)); err != nil || rev2 <= rev {
			t.Fatalf("%s: create over the marker: rev %d (was %d), %v", id, rev2, rev, err)
		}
		got, _, err := s.Get(ctx, "demo", id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if want := map[bool]api.JobState{false: api.StateQueued, true: api.StateInFlight}[fresh]; got.State != want {
			t.Fatalf("%s: state %s, want %s", id, got.State, want)
		}
	}
}

// TestStaleClaimLoses: a claim at a revision the record has left (a
// duplicate delivery's hint) writes nothing over the newer record; it
// reads the record again and claims that.
func TestStaleClaimLoses(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	now := time.Now().UTC()
	rev, _, err := s.Create(ctx, queued("stale"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(ctx, "demo", "stale", records.Everyone, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "stale", Hint: rev, Stored: now, Now: now}); !errors.Is(err, records.ErrNotStartable) {
		t.Fatalf("claim at the stale revision %d of a cancelled job: %v, want ErrNotStartable", rev, err)
	}
	got, _, err := s.Get(ctx, "demo", "stale")
	if err != nil || got.State != api.StateCancelled {
		t.Fatalf("record after the stale claim: %+v, %v; want cancelled", got, err)
	}
}

// TestCompareAndSetOnReplicas: on a three-node JetStream cluster, a
// bucket with three replicas (nats.replicas: 3) refuses a stale write
// as the single server does: the claim and the cancel of one queued job
// race and exactly one wins, a fresh claim meets a cancelled record, and
// a second create finds the first.
func TestCompareAndSetOnReplicas(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	nc, _ := testenv.JetStream(t, cluster.URLs())
	s, err := records.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A cluster whose nodes are healthy may not yet place three replicas
	// ("no suitable peers for placement" until the meta leader has heard
	// from every peer): the bucket is made once it can be.
	testenv.EventuallyNil(t, 30*time.Second, "a three-replica records bucket", func() error {
		return s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, Replicas: 3})
	})
	for i := range 20 {
		id := "r3-" + strconv.Itoa(i)
		rev, _, err := s.Create(ctx, queued(id))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Create(ctx, queued(id)); !errors.Is(err, records.ErrExists) {
			t.Fatalf("%s: second create: %v, want ErrExists", id, err)
		}
		oneWins(t, id,
			func() error { _, err := s.Cancel(ctx, "demo", id, records.Everyone, time.Now()); return err },
			func() error {
				_, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Hint: rev, Stored: time.Now(), Now: time.Now()})
				return err
			})
	}
	now := time.Now().UTC()
	if _, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "r3-fresh", Stored: now}, records.Everyone, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "r3-fresh", Fresh: true, Stored: now, Now: now}); !errors.Is(err, records.ErrNotStartable) {
		t.Fatalf("fresh claim of a cancelled job: %v, want ErrNotStartable", err)
	}
}

// oneWins runs a cancel and a start of the job id at once and fails the
// test unless exactly one of them wins (the loser answering ErrStarted or
// ErrNotStartable); it reports whether the cancel won.
func oneWins(t *testing.T, id string, cancel, start func() error) (cancelled bool) {
	t.Helper()
	var c, st bool
	var wg sync.WaitGroup
	wg.Go(func() {
		err := cancel()
		c = err == nil
		if err != nil && !errors.Is(err, records.ErrStarted) {
			t.Errorf("cancel %s: %v", id, err)
		}
	})
	wg.Go(func() {
		err := start()
		st = err == nil
		if err != nil && !errors.Is(err, records.ErrNotStartable) {
			t.Errorf("start %s: %v", id, err)
		}
	})
	wg.Wait()
	if c == st {
		t.Fatalf("%s: cancelled %v and started %v: exactly one must win", id, c, st)
	}
	return c
}

// TestAttemptsAreBounded: a record keeps its last MaxAttempts attempts. A
// target answering 429 for long adds an attempt per answer (none counts
// against retry.max_attempts); without a bound the record outgrew its
// bucket's value size (64KiB for a lane keeping no body) and its writes
// were refused, so it never settled.
func TestAttemptsAreBounded(t *testing.T) {
	s := newStore(t, time.Hour)
	ctx := context.Background()
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rev, _, err := s.Create(ctx, queued("busy"))
	if err != nil {
		t.Fatal(err)
	}
	const answers = 1500
	for i := range answers {
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "busy", Hint: rev, Stored: t0, Now: t0})
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		rev = 0
		end, err := s.Finish(ctx, c, func(r *api.JobRecord) {
			r.Attempts = append(r.Attempts, api.JobAttempt{At: t0.Add(time.Duration(i) * time.Second), Status: 429, DurationMillis: 12.345})
			r.State = api.StateRetrying
			if i == answers-1 {
				r.State, r.FinishedAt = api.StateDelivered, &t0
			}
		})
		if err != nil {
			t.Fatalf("end of attempt %d: %v", i, err)
		}
		if len(end.Attempts) > records.MaxAttempts {
			t.Fatalf("attempt %d: the record keeps %d attempts, want at most %d", i, len(end.Attempts), records.MaxAttempts)
		}
	}
	got, _, err := s.Get(ctx, "demo", "busy")
	if err != nil || got.State != api.StateDelivered || len(got.Attempts) != records.MaxAttempts ||
		!got.Attempts[len(got.Attempts)-1].At.Equal(t0.Add((answers-1)*time.Second)) {
		t.Fatalf("record after %d answers: %s, %d attempts, %v; want delivered with the last %d", answers, got.State, len(got.Attempts), err, records.MaxAttempts)
	}
}
