package buckettest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// runPair is the part of the suite for stores of keyed lanes
// (bucket.PairStore); Run calls it when the store is one.
func runPair(t *testing.T, newStore Factory, near func(*testing.T, string, time.Duration, time.Duration)) {
	ctx := context.Background()
	pair := func(t *testing.T, s bucket.Store) bucket.PairStore {
		p, ok := s.(bucket.PairStore)
		if !ok {
			t.Fatalf("%T is no bucket.PairStore", s)
		}
		return p
	}

	t.Run("PairStepTable", func(t *testing.T) {
		c := NewClock()
		s := pair(t, newStore(t, c))
		lane := bucket.Limit{Rate: 10, Burst: 2} // T = 100ms
		slow := bucket.Limit{Rate: 4, Burst: 1}  // T = 250ms
		a, b := bucket.Key{Lane: "demo", Sub: "a"}, bucket.Key{Lane: "demo", Sub: "b"}
		start := c.Now()
		steps := []struct {
			at        time.Duration
			k         bucket.Key
			ok, free  bool
			due, next time.Duration // next: the key's
		}{
			{0, a, true, true, 0, 250 * time.Millisecond},
			// a is not ready for 250ms: nothing is taken from the lane.
			{0, a, false, false, 0, 250 * time.Millisecond},
			{0, b, true, true, 0, 250 * time.Millisecond},
			// The lane's burst of 2 is used: b's next slot (250ms) is the
			// lane's own next one (100ms) + more than PairSlack.
			{0, b, false, false, 0, 250 * time.Millisecond},
			{250 * time.Millisecond, a, true, true, 0, 250 * time.Millisecond},
			{250 * time.Millisecond, b, true, true, 0, 250 * time.Millisecond},
			// Both used the lane's slots: its next is 100ms ahead, a's 250.
			{260 * time.Millisecond, a, false, false, 0, 240 * time.Millisecond},
		}
		for i, st := range steps {
			c.Advance(start.Add(st.at).Sub(c.Now()))
			r, err := s.ReservePair(ctx, st.k, lane, slow, 0, 0)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if r.OK != st.ok || r.Free != st.free {
				t.Fatalf("step %d (%v at %v): ok=%v free=%v, want ok=%v free=%v (%+v)", i, st.k, st.at, r.OK, r.Free, st.ok, st.free, r)
			}
			near(t, "due", r.Due, st.due)
			near(t, "key next", r.KeyNext, st.next)
		}
	})

	t.Run("PairReservedAheadOfTheKeysSlot", func(t *testing.T) {
		c := NewClock()
		s := pair(t, newStore(t, c))
		lane := bucket.Limit{Rate: 100, Burst: 10}
		kl := bucket.Limit{Rate: 10, Burst: 1} // T = 100ms
		k := bucket.Key{Lane: "demo", Sub: "a"}
		if r, err := s.ReservePair(ctx, k, lane, kl, 20*time.Millisecond, 0); err != nil || !r.OK || !r.Free {
			t.Fatalf("first: %+v, %v", r, err)
		}
		c.Advance(85 * time.Millisecond)
		// 15ms before the key's slot: too early without a lead, fine with 20ms.
		if r, err := s.ReservePair(ctx, k, lane, kl, 0, 0); err != nil || r.OK {
			t.Fatalf("without a lead: %+v, %v", r, err)
		}
		r, err := s.ReservePair(ctx, k, lane, kl, 20*time.Millisecond, 0)
		if err != nil || !r.OK || r.Free {
			t.Fatalf("with a 20ms lead: %+v, %v", r, err)
		}
		// The slot is the key's own, exactly: no drift from asking early.
		near(t, "due", r.Due, 15*time.Millisecond)
		near(t, "key next", r.KeyNext, 115*time.Millisecond)
	})

	t.Run("PairLaneCapBindsAndDelays", func(t *testing.T) {
		c := NewClock()
		s := pair(t, newStore(t, c))
		lane := bucket.Limit{Rate: 10, Burst: 1}
		fast := bucket.Limit{Rate: 1000, Burst: 100}
		var dues []time.Duration
		for i := range 5 {
			r, err := s.ReservePair(ctx, bucket.Key{Lane: "demo", Sub: string(rune('a' + i))}, lane, fast, 0, 0)
			if err != nil || !r.OK {
				t.Fatalf("reservation %d: %+v, %v", i, r, err)
			}
			dues = append(dues, r.Due)
		}
		for i, d := range dues {
			near(t, "due", d, time.Duration(i)*100*time.Millisecond)
		}
	})

	t.Run("PairCarriesLateStarts", func(t *testing.T) {
		// A key's slot that started 40ms after its theoretical time
		// (KeyLatest) counts there: its next slot is a period after the
		// start, not after the slot. A refusal stores nothing, so the
		// carry is asked again.
		c := NewClock()
		s := pair(t, newStore(t, c))
		lane := bucket.Limit{Rate: 100, Burst: 1}
		kl := bucket.Limit{Rate: 4, Burst: 1} // T = 250ms
		k := bucket.Key{Lane: "demo", Sub: "a"}
		start := c.Now()
		steps := []struct {
			at, carry         time.Duration
			ok                bool
			due, next, latest time.Duration
		}{
			{0, 0, true, 0, 250 * time.Millisecond, 0},
			// Started at 40ms: the key's next slot is at 290ms.
			{40 * time.Millisecond, 40 * time.Millisecond, false, 0, 250 * time.Millisecond, 0},
			{250 * time.Millisecond, 40 * time.Millisecond, false, 0, 40 * time.Millisecond, 0},
			{290 * time.Millisecond, 40 * time.Millisecond, true, 0, 250 * time.Millisecond, 0},
			// On time: nothing to carry; a period later.
			{540 * time.Millisecond, 0, true, 0, 250 * time.Millisecond, 0},
			// Reserved 5ms ahead: due and theoretical time 5ms from now.
			{785 * time.Millisecond, 0, true, 5 * time.Millisecond, 255 * time.Millisecond, 5 * time.Millisecond},
		}
		for i, st := range steps {
			c.Advance(start.Add(st.at).Sub(c.Now()))
			r, err := s.ReservePair(ctx, k, lane, kl, 5*time.Millisecond, st.carry)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if r.OK != st.ok {
				t.Fatalf("step %d at %v: ok=%v, want %v (%+v)", i, st.at, r.OK, st.ok, r)
			}
			near(t, "key next", r.KeyNext, st.next)
			if r.OK {
				near(t, "due", r.Due, st.due)
				near(t, "key latest", r.KeyLatest, st.latest)
			}
		}
	})

	t.Run("PairNoOvershootUnderRandomLoad", func(t *testing.T) {
		c := NewClock()
		s := pair(t, newStore(t, c))
		rng := rand.New(rand.NewPCG(7, 13))
		lane := bucket.Limit{Rate: 40, Burst: 5}
		keyLim := bucket.Limit{Rate: 10, Burst: 3}
		start := c.Now()
		perKey := map[string][]time.Duration{}
		var all []time.Duration
		for range 1500 {
			c.Advance(time.Duration(rng.IntN(12)) * time.Millisecond)
			k := bucket.Key{Lane: "demo", Sub: string(rune('a' + rng.IntN(8)))}
			r, err := s.ReservePair(ctx, k, lane, keyLim, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK {
				continue
			}
			at := c.Now().Sub(start) + r.Due
			perKey[k.Sub] = append(perKey[k.Sub], at)
			all = append(all, at)
		}
		if len(all) < 300 {
			t.Fatalf("only %d slots over the run", len(all))
		}
		CheckWindows(t, all, lane, 0)
		for k, starts := range perKey {
			if len(starts) == 0 {
				t.Fatalf("key %s got nothing", k)
			}
			CheckWindows(t, starts, keyLim, 0)
		}
	})

	t.Run("PairKeyPauseHoldsOnlyThatKey", func(t *testing.T) {
		c := NewClock()
		st := newStore(t, c)
		s := pair(t, st)
		lane := bucket.Limit{Rate: 100, Burst: 10}
		kl := bucket.Limit{Rate: 10, Burst: 2}
		a, b := bucket.Key{Lane: "demo", Sub: "a"}, bucket.Key{Lane: "demo", Sub: "b"}
		if err := st.Pause(ctx, a, kl, time.Second); err != nil {
			t.Fatal(err)
		}
		r, err := s.ReservePair(ctx, a, lane, kl, 0, 0)
		if err != nil || r.OK {
			t.Fatalf("paused key reserved: %+v, %v", r, err)
		}
		near(t, "paused key next", r.KeyNext, time.Second)
		if r, err := s.ReservePair(ctx, b, lane, kl, 0, 0); err != nil || !r.OK || !r.Free {
			t.Fatalf("other key held by a's pause: %+v, %v", r, err)
		}
	})
}
