package redisbucket_test

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/testenv"
)

// TestLostStateIsRestored: Redis restarts without persistence right after a
// lane spent its burst. Without the floors the empty Redis would grant a
// second full burst at once (burst 10 at 1/s: 20 admissions within a second,
// where the limit allows 11). With them, the first call after the restart
// restores the state as an empty bucket, for this instance and for an
// instance that never saw the lane.
func TestLostStateIsRestored(t *testing.T) {
	srv := testenv.StartRedis(t)
	var logs strings.Builder
	cfg := redisbucket.DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s := redisbucket.New(newFailFastClient(t, srv.Addr), cfg)
	l := bucket.Limit{Rate: 1, Burst: 10} // τ = 9s
	for i := range l.Burst {
		if d, err := s.Admit(ctx, lane, l); err != nil || !d.Allowed {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
	}
	start := time.Now()
	srv.Stop(t)
	srv.Start(t)
	var d bucket.Decision
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		// The pool's connections died with the server: the first call may
		// fail, the next one dials again.
		if d, err = s.Admit(ctx, lane, l); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || s.Restored() != 1 {
		t.Fatalf("admit after the restart (%v after the burst): %+v, restored %d; want refused and the state restored once",
			time.Since(start).Round(time.Millisecond), d, s.Restored())
	}
	if !strings.Contains(logs.String(), "restored as an empty bucket") || !strings.Contains(logs.String(), "thr:{demo}:gcra") {
		t.Fatalf("no warning naming the key:\n%s", logs.String())
	}
	// The restored tat is max(floor, now + τ + T) = about 10 s from the
	// burst: the next admission in about a second, not before.
	if lo := time.Second - time.Since(start) - time.Millisecond; d.RetryAfter < lo || d.RetryAfter > time.Second+time.Millisecond {
		t.Fatalf("RetryAfter %v, want in [%v, 1s]", d.RetryAfter, lo)
	}
	// Another instance, which never saw the lane, finds the restored state.
	other := redisbucket.New(newClient(t, srv.Addr), redisbucket.DefaultConfig())
	if d, err := other.Admit(ctx, lane, l); err != nil || d.Allowed {
		t.Fatalf("admit by another instance after the restore: %+v %v, want refused", d, err)
	}
	if other.Restored() != 0 {
		t.Fatalf("the other instance restored %d states; it has no floor", other.Restored())
	}
}

// TestLostStateFloors covers the other operations with FLUSHALL standing in
// for the loss, and the case that must stay as it was: a lane whose tat
// passed is a full bucket, whatever happened to Redis.
func TestLostStateFloors(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	s := redisbucket.New(client, redisbucket.DefaultConfig())
	flush := func() {
		t.Helper()
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("PauseSurvives", func(t *testing.T) {
		k := bucket.Key{Lane: "paused"}
		l := bucket.Limit{Rate: 100, Burst: 5}
		if err := s.Pause(ctx, k, l, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		flush()
		r, err := s.Reserve(ctx, k, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		// The downstream asked for 30 s; the first slot is no earlier.
		if r.First < 29*time.Second || r.First > 30*time.Second {
			t.Fatalf("first slot after the loss in %v, want about 30s", r.First)
		}
	})

	t.Run("ReservationsSurvive", func(t *testing.T) {
		k := bucket.Key{Lane: "backlog"}
		l := bucket.Limit{Rate: 10, Burst: 2} // T = 100ms, τ = 100ms
		if _, err := s.Reserve(ctx, k, l, 20); err != nil {
			t.Fatal(err)
		}
		before := s.Restored()
		flush()
		r, err := s.Reserve(ctx, k, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		// 20 slots were handed out: the 21st comes 1.9 s after the first.
		if r.First < 1800*time.Millisecond || r.First > 1900*time.Millisecond {
			t.Fatalf("slot 21 after the loss in %v, want about 1.9s", r.First)
		}
		if s.Restored() != before+1 {
			t.Fatalf("restored %d, want %d", s.Restored(), before+1)
		}
		// Peek sees the restored state too and does not restore it again.
		if d, err := s.Peek(ctx, k, l); err != nil || d.Allowed || s.Restored() != before+1 {
			t.Fatalf("peek after the restore: %+v %v (restored %d)", d, err, s.Restored())
		}
	})

	t.Run("OlderStateIsRestored", func(t *testing.T) {
		// A failover to a replica that lagged: the key is there, with the
		// tat of 10 reservations ago.
		k := bucket.Key{Lane: "lagged"}
		l := bucket.Limit{Rate: 10, Burst: 2} // T = 100ms, τ = 100ms
		if _, err := s.Reserve(ctx, k, l, 10); err != nil {
			t.Fatal(err)
		}
		old, err := client.Get(ctx, s.Key(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reserve(ctx, k, l, 10); err != nil {
			t.Fatal(err)
		}
		if err := client.Set(ctx, s.Key(k), old, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		before := s.Restored()
		r, err := s.Reserve(ctx, k, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.First < 1800*time.Millisecond || r.First > 1900*time.Millisecond || s.Restored() != before+1 {
			t.Fatalf("slot 21 after the lagged failover in %v (restored %d → %d), want about 1.9s, restored once",
				r.First, before, s.Restored())
		}
	})

	t.Run("HeldByOthersPushesTheRestore", func(t *testing.T) {
		// Two other instances may each hold 4 slots they reserved after
		// this one last saw the state: the restore leaves room for them.
		k := bucket.Key{Lane: "shared"}
		l := bucket.Limit{Rate: 10, Burst: 2} // T = 100ms, τ = 100ms
		cfg := redisbucket.DefaultConfig()
		var asked []bucket.Key
		cfg.Held = func(k bucket.Key) int { asked = append(asked, k); return 8 }
		held := redisbucket.New(client, cfg)
		if _, err := held.Reserve(ctx, k, l, 20); err != nil {
			t.Fatal(err)
		}
		if len(asked) != 0 {
			t.Fatalf("Held asked %v without a floor to restore from", asked)
		}
		flush()
		r, err := held.Reserve(ctx, k, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Slot 21 at 1.9 s, then the 8 slots others may hold: 2.7 s.
		if r.First < 2600*time.Millisecond || r.First > 2700*time.Millisecond {
			t.Fatalf("first slot after the loss in %v, want about 2.7s", r.First)
		}
		if len(asked) == 0 || asked[0] != k {
			t.Fatalf("Held asked for %v, want %v", asked, k)
		}
	})

	t.Run("OthersSlotsAreNotGrantedAgain", func(t *testing.T) {
		// Three instances take a slot each in turn; Redis loses the state;
		// the first of them to call again restores it. Without Held its
		// next slot falls on the second instance's (two starts in one
		// period at burst 1); with Held it comes after the third's.
		k := bucket.Key{Lane: "three"}
		l := bucket.Limit{Rate: 10, Burst: 1} // T = 100ms, τ = 0
		for _, tc := range []struct {
			held int
			ok   bool
		}{{0, false}, {2, true}} {
			cfg := redisbucket.DefaultConfig()
			cfg.Held = func(bucket.Key) int { return tc.held }
			a := redisbucket.New(client, cfg)
			b := redisbucket.New(client, cfg)
			c := redisbucket.New(client, cfg)
			flush()
			var due []time.Time
			for _, s := range []*redisbucket.Store{a, b, c} {
				r, err := s.Reserve(ctx, k, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				due = append(due, time.Now().Add(r.First))
			}
			flush()
			r, err := a.Reserve(ctx, k, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			next := time.Now().Add(r.First)
			clear := next.Sub(due[2]) >= l.Period()-5*time.Millisecond
			if clear != tc.ok {
				t.Errorf("held %d: the restored slot comes %v after the third instance's (slots %v apart before), want clear of it = %v",
					tc.held, next.Sub(due[2]).Round(time.Millisecond), due[1].Sub(due[0]).Round(time.Millisecond), tc.ok)
			}
		}
	})

	t.Run("IdleLaneBurstsAsBefore", func(t *testing.T) {
		k := bucket.Key{Lane: "idle"}
		l := bucket.Limit{Rate: 1000, Burst: 5} // refills in 5 ms
		for range l.Burst {
			if _, err := s.Admit(ctx, k, l); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
		before := s.Restored()
		flush()
		d, err := s.Admit(ctx, k, l)
		if err != nil || !d.Allowed || d.Remaining != l.Burst-1 || s.Restored() != before {
			t.Fatalf("admit on a refilled lane after the loss: %+v %v (restored %d → %d), want a full bucket",
				d, err, before, s.Restored())
		}
	})
}

// TestFloorFollowsTheTat: every call keeps its key's floor for as long as
// the tat it saw is ahead, plus a second of slack for the clocks (on the
// script's clock, here a stopped one: only real time since the call is
// taken off). A floor dropped early would let a loss hand out a burst.
func TestFloorFollowsTheTat(t *testing.T) {
	s := onClock(newClient(t, sharedRedis(t)), fixedClock())
	l := bucket.Limit{Rate: 10, Burst: 2} // T = 100ms, τ = 100ms
	const slack = time.Second
	check := func(op string, k bucket.Key, rel time.Duration) {
		t.Helper()
		// The call took real time, at most the test's tolerance (a busy
		// machine); the floor's end is measured after it.
		if got, want := redisbucket.FloorAhead(s, k), rel+slack; got > want || got < want-300*time.Millisecond {
			t.Errorf("%s: floor kept %v more, want %v (tat %v ahead + %v)", op, got, want, rel, slack)
		}
	}
	k := bucket.Key{Lane: "floors", Sub: "reserve"}
	if _, err := s.Reserve(ctx, k, l, 20); err != nil {
		t.Fatal(err)
	}
	check("Reserve 20", k, 20*l.Period()) // a fresh bucket: tat = now + 20 T
	k = bucket.Key{Lane: "floors", Sub: "admit"}
	if _, err := s.Admit(ctx, k, l); err != nil {
		t.Fatal(err)
	}
	check("Admit", k, l.Period())
	k = bucket.Key{Lane: "floors", Sub: "pause"}
	if err := s.Pause(ctx, k, l, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	check("Pause 3s", k, 3*time.Second+l.Period()) // no start for 3s, then an empty bucket
	if _, err := s.Peek(ctx, k, l); err != nil {
		t.Fatal(err)
	}
	check("Peek", k, 3*time.Second+l.Period())

	// A keyed slot: the lane's floor is the lane's tat, 20 slots ahead
	// after 20 reservations of as many keys (the lane's next start a
	// second earlier, its burst of 11 less one).
	lane, ll := bucket.Key{Lane: "pair"}, bucket.Limit{Rate: 10, Burst: 11}
	kl := bucket.Limit{Rate: 1, Burst: 1}
	for i := range 20 {
		r, err := s.ReservePair(ctx, bucket.Key{Lane: "pair", Sub: strconv.Itoa(i)}, ll, kl, time.Minute, 0)
		if err != nil || !r.OK {
			t.Fatalf("pair %d: %+v %v", i, r, err)
		}
	}
	check("ReservePair ×20", lane, 20*ll.Period())
}
