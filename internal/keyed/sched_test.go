package keyed_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/keyed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// simKey is one key of a simulated keyed lane.
type simKey struct {
	limit   bucket.Limit
	weight  float64
	backlog int
	arrive  time.Duration // when its jobs are stored
	paused  time.Duration // paused from its arrival for this long
	// pushBack, when set, says whether the key's downstream pushes back
	// on a start at this time since the beginning (keyed.Slowdown).
	pushBack func(at time.Duration) bool
}

// simulate runs the lane runtime's loop (choose a key, reserve its slot,
// start the job at the slot; choose when the lane's next slot comes) on a manual clock for d, with jobs that settle
// at once, and returns each key's start times from the beginning.
func simulate(t *testing.T, c *clock.Manual, store bucket.PairStore, lane bucket.Limit, keys map[string]*simKey, d time.Duration) map[string][]time.Duration {
	t.Helper()
	return simulateSlow(t, c, store, lane, keys, d, nil)
}

// simulateSlow is simulate with adaptive mode per key: a key's limit is its
// rate times its factor in slow, and a start its downstream pushes back on
// lowers that factor.
func simulateSlow(t *testing.T, c *clock.Manual, store bucket.PairStore, lane bucket.Limit, keys map[string]*simKey, d time.Duration, slow *keyed.Slowdown) map[string][]time.Duration {
	t.Helper()
	ctx := context.Background()
	s := keyed.New(func(k string) keyed.Opts { return keyed.Opts{Weight: keys[k].weight} })
	begin := c.Now()
	arrived := map[string]bool{}
	starts := map[string][]time.Duration{}
	laneNext := begin
	for c.Now().Sub(begin) < d {
		now := c.Now()
		nextArrival := time.Duration(math.MaxInt64)
		for k, sk := range keys {
			if arrived[k] {
				continue
			}
			if at := begin.Add(sk.arrive); !at.After(now) {
				arrived[k] = true
				s.Add(k, now)
				if sk.paused > 0 {
					s.Pause(k, now.Add(sk.paused))
				}
			} else {
				nextArrival = min(nextArrival, at.Sub(now))
			}
		}
		if laneNext.After(now) {
			// Choose at the lane's next slot, not before: a key that gets
			// jobs meanwhile competes for it.
			c.Advance(laneNext.Sub(now))
			continue
		}
		key, wait := s.Next(now, laneNext)
		if key == "" {
			if wait < 0 || wait > nextArrival {
				wait = nextArrival
			}
			if wait == time.Duration(math.MaxInt64) {
				break
			}
			c.Advance(max(wait, time.Microsecond))
			continue
		}
		sk := keys[key]
		if sk.backlog == 0 {
			s.Empty(key, now)
			continue
		}
		lim := sk.limit
		if slow != nil {
			lim.Rate *= slow.Factor(key, now)
		}
		r, err := store.ReservePair(ctx, bucket.Key{Lane: "sim", Sub: key}, lane, lim, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		laneNext = now.Add(r.LaneNext)
		if !r.OK {
			s.NotReady(key, now.Add(r.KeyNext))
			continue
		}
		s.Started(key, now.Add(r.KeyNext))
		sk.backlog--
		c.Advance(r.Due)
		starts[key] = append(starts[key], c.Now().Sub(begin))
		if slow != nil && sk.pushBack != nil && sk.pushBack(c.Now().Sub(begin)) {
			slow.Limited(key, c.Now())
		}
		s.Settled(key, c.Now())
	}
	return starts
}

// rateOver is the number of starts in [from, to) per second.
func rateOver(starts []time.Duration, from, to time.Duration) float64 {
	n := 0
	for _, s := range starts {
		if s >= from && s < to {
			n++
		}
	}
	return float64(n) / (to - from).Seconds()
}

// TestKeysKeepOwnRatesBesideABacklog: three keys at 5/s, 5/s and 50/s, the
// fast one with a 10,000-job backlog stored first: each keeps its own rate
// within 3 %, and the slow keys' first jobs start at once.
func TestKeysKeepOwnRatesBesideABacklog(t *testing.T) {
	pairStores(t, func(t *testing.T, c *clock.Manual, store bucket.PairStore) {
		lane := bucket.Limit{Rate: 1000, Burst: 10}
		keys := map[string]*simKey{
			"hot": {limit: bucket.Limit{Rate: 50, Burst: 1}, backlog: 10_000},
			"a":   {limit: bucket.Limit{Rate: 5, Burst: 1}, backlog: 1000, arrive: 10 * time.Millisecond},
			"b":   {limit: bucket.Limit{Rate: 5, Burst: 1}, backlog: 1000, arrive: 3 * time.Second},
		}
		starts := simulate(t, c, store, lane, keys, 20*time.Second)
		for k, want := range map[string]float64{"hot": 50, "a": 5, "b": 5} {
			got := rateOver(starts[k], 4*time.Second, 20*time.Second)
			if math.Abs(got-want)/want > 0.03 {
				t.Errorf("key %s ran at %.2f/s, want %v ± 3%%", k, got, want)
			}
			buckettest.CheckWindows(t, starts[k], keys[k].limit, 0)
		}
		if first := starts["a"][0]; first != 10*time.Millisecond {
			t.Errorf("a's first job started at %v, stored at 10ms: delayed by the backlog", first)
		}
		if first := starts["b"][0]; first != 3*time.Second {
			t.Errorf("b's first job started at %v, stored at 3s: delayed by the backlog", first)
		}
	})
}

// TestLaneCapSharedByWeight: ten keys at 10/s under a lane cap of 40/s: at
// most 40 starts in any 1-s window (burst + rate·W in every window), and
// each key's share within 10 % of its weight's.
func TestLaneCapSharedByWeight(t *testing.T) {
	for _, weighted := range []bool{false, true} {
		t.Run(fmt.Sprintf("weighted=%v", weighted), func(t *testing.T) {
			pairStores(t, func(t *testing.T, c *clock.Manual, store bucket.PairStore) {
				lane := bucket.Limit{Rate: 40, Burst: 1}
				keys := map[string]*simKey{}
				total := 0.0
				for i := range 10 {
					w := 1.0
					if weighted && i >= 5 {
						w = 2
					}
					total += w
					keys[fmt.Sprintf("k%d", i)] = &simKey{limit: bucket.Limit{Rate: 10, Burst: 2}, weight: w, backlog: 100_000}
				}
				starts := simulate(t, c, store, lane, keys, 20*time.Second)
				var all []time.Duration
				for k, sk := range keys {
					all = append(all, starts[k]...)
					want := 40 * sk.weight / total
					got := rateOver(starts[k], time.Second, 20*time.Second)
					if math.Abs(got-want)/want > 0.10 {
						t.Errorf("key %s (weight %v) got %.2f/s of the lane's 40/s, want %.2f ± 10%%", k, sk.weight, got, want)
					}
					buckettest.CheckWindows(t, starts[k], sk.limit, 0)
				}
				buckettest.CheckWindows(t, all, lane, 0)
			})
		})
	}
}

// TestColdKeyNotBehindHotBacklog: a hot key uses the whole lane cap with a
// 100,000-job backlog; a cold key's job starts within one lane period of
// being stored.
func TestColdKeyNotBehindHotBacklog(t *testing.T) {
	pairStores(t, func(t *testing.T, c *clock.Manual, store bucket.PairStore) {
		lane := bucket.Limit{Rate: 100, Burst: 1}
		keys := map[string]*simKey{
			"hot":  {limit: bucket.Limit{Rate: 1000, Burst: 10}, backlog: 100_000},
			"cold": {limit: bucket.Limit{Rate: 1, Burst: 1}, backlog: 1, arrive: 2*time.Second + 3*time.Millisecond},
		}
		starts := simulate(t, c, store, lane, keys, 3*time.Second)
		if len(starts["cold"]) != 1 {
			t.Fatalf("cold key started %d jobs", len(starts["cold"]))
		}
		if delay := starts["cold"][0] - keys["cold"].arrive; delay > lane.Period() {
			t.Errorf("cold key's job waited %v behind the hot key's backlog, want ≤ one lane period (%v)", delay, lane.Period())
		}
	})
}

// TestPausedKeyHoldsOnlyItself: a key paused by its downstream starts
// nothing during the pause; the others keep their rates.
func TestPausedKeyHoldsOnlyItself(t *testing.T) {
	pairStores(t, func(t *testing.T, c *clock.Manual, store bucket.PairStore) {
		lane := bucket.Limit{Rate: 1000, Burst: 10}
		keys := map[string]*simKey{
			"limited": {limit: bucket.Limit{Rate: 10, Burst: 1}, backlog: 1000, paused: 2 * time.Second},
			"a":       {limit: bucket.Limit{Rate: 10, Burst: 1}, backlog: 1000},
			"b":       {limit: bucket.Limit{Rate: 20, Burst: 1}, backlog: 1000},
		}
		starts := simulate(t, c, store, lane, keys, 4*time.Second)
		if got := rateOver(starts["limited"], 0, 2*time.Second); got != 0 {
			t.Errorf("paused key started %.1f/s during its pause", got)
		}
		if got := rateOver(starts["limited"], 2*time.Second, 4*time.Second); math.Abs(got-10) > 0.6 {
			t.Errorf("paused key ran at %.2f/s after its pause, want 10", got)
		}
		for k, want := range map[string]float64{"a": 10, "b": 20} {
			if got := rateOver(starts[k], 0, 4*time.Second); math.Abs(got-want)/want > 0.03 {
				t.Errorf("key %s ran at %.2f/s beside a paused key, want %v", k, got, want)
			}
		}
	})
}

// TestIdleKeysAreForgotten: a key whose jobs are all settled costs nothing.
func TestIdleKeysAreForgotten(t *testing.T) {
	c := buckettest.NewClock()
	s := keyed.New(nil)
	for i := range 1000 {
		s.Add(fmt.Sprint(i), c.Now())
	}
	for {
		k, _ := s.Next(c.Now(), c.Now())
		if k == "" {
			break
		}
		if !s.Empty(k, c.Now()) {
			t.Fatalf("key %s with nothing in flight not idle", k)
		}
	}
	if st := s.Stats(c.Now()); st.Active != 0 {
		t.Fatalf("%d keys remembered after all went idle", st.Active)
	}
}

// TestOrderedKeyWaitsForSettle: with at most one job in flight per key
// (per_key.ordered), a key's next job is not chosen before the previous
// one settled, and other keys are not held.
func TestOrderedKeyWaitsForSettle(t *testing.T) {
	c := buckettest.NewClock()
	s := keyed.New(func(string) keyed.Opts { return keyed.Opts{MaxInflight: 1} })
	now := c.Now()
	s.Add("a", now)
	s.Add("b", now)
	k, _ := s.Next(now, now)
	if k != "a" {
		t.Fatalf("first choice %q, want a", k)
	}
	s.Started("a", now)
	if k, _ := s.Next(now, now); k != "b" {
		t.Fatalf("second choice %q, want b (a holds its job in flight)", k)
	}
	s.Started("b", now)
	if k, w := s.Next(now, now); k != "" || w >= 0 {
		t.Fatalf("chose %q (wait %v) while both keys have a job in flight", k, w)
	}
	s.Settled("a", now)
	if k, _ := s.Next(now, now); k != "a" {
		t.Fatalf("after a settled chose %q", k)
	}
}

// TestPauseWhileHeldOutlastsTheHold: a key held by its operator (Opts.Paused)
// and asked by its downstream to wait (Pause) meanwhile is not chosen before
// that wait ends once the hold is lifted, though its own slot came earlier.
func TestPauseWhileHeldOutlastsTheHold(t *testing.T) {
	c := buckettest.NewClock()
	now := c.Now()
	s := keyed.New(func(string) keyed.Opts { return keyed.Opts{MaxInflight: 2} })
	s.Add("a", now)
	if k, _ := s.Next(now, now); k != "a" {
		t.Fatalf("first choice %q, want a", k)
	}
	slot, until := now.Add(time.Second), now.Add(3*time.Second)
	steps := []struct {
		name string
		do   func()
		at   time.Time
		key  string
		wait time.Duration
	}{
		{"started: its next slot in 1 s", func() { s.Started("a", slot) }, now, "", time.Second},
		{"held, paused until 3 s meanwhile, the hold lifted: waits for the pause", func() {
			s.SetOpts("a", keyed.Opts{MaxInflight: 2, Paused: true})
			s.Pause("a", until)
			s.SetOpts("a", keyed.Opts{MaxInflight: 2})
		}, slot, "", 2 * time.Second},
		{"chosen when the pause ends", func() {}, until, "a", 0},
	}
	for _, st := range steps {
		st.do()
		if k, w := s.Next(st.at, st.at); k != st.key || w != st.wait {
			t.Fatalf("%s: Next = %q, %v; want %q, %v", st.name, k, w, st.key, st.wait)
		}
	}
}

// TestHeldKeyIsNotChosen: a key its operator holds (Opts.Paused, set by
// SetOpts) is not chosen at its slot; released, it is at once. Settings for
// a key not known are dropped.
func TestHeldKeyIsNotChosen(t *testing.T) {
	c := buckettest.NewClock()
	now := c.Now()
	s := keyed.New(nil)
	s.SetOpts("unknown", keyed.Opts{Paused: true})
	s.Add("a", now)
	steps := []struct {
		name string
		opts keyed.Opts
		key  string
		wait time.Duration
	}{
		{"held", keyed.Opts{Paused: true}, "", -1},
		{"released", keyed.Opts{}, "a", 0},
	}
	for _, st := range steps {
		s.SetOpts("a", st.opts)
		if k, w := s.Next(now, now); k != st.key || w != st.wait {
			t.Fatalf("%s: Next = %q, %v; want %q, %v", st.name, k, w, st.key, st.wait)
		}
	}
}

// TestKeySinceIsWhenItBecameKnown: a key's Since is the time of the Add
// that made it known; later Adds while it stays known leave it, and a key
// forgotten and added again counts from the new Add.
func TestKeySinceIsWhenItBecameKnown(t *testing.T) {
	t0 := time.Unix(1_000, 0)
	t1, t3 := t0.Add(time.Second), t0.Add(3*time.Second)
	s := keyed.New(nil)
	steps := []struct {
		name  string
		do    func()
		known bool
		since time.Time
	}{
		{"unknown", func() {}, false, time.Time{}},
		{"added at t0", func() { s.Add("a", t0) }, true, t0},
		{"added again at t1", func() { s.Add("a", t1) }, true, t0},
		{"forgotten", func() { s.Forget("a") }, false, time.Time{}},
		{"added at t3", func() { s.Add("a", t3) }, true, t3},
	}
	for _, st := range steps {
		st.do()
		got := s.Key("a")
		if got.Known != st.known || !got.Since.Equal(st.since) {
			t.Fatalf("%s: known %v since %v, want %v since %v", st.name, got.Known, got.Since, st.known, st.since)
		}
	}
}
