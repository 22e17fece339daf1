package leaky

import (
	"testing"
	"time"
)

// TestStoreClockPlacesTheStoresNow: where a store's reading falls on the
// local clock, step by step, for a store on the same clock, one a second
// ahead and one a second behind. Each step is a call sent at sent (from
// t0), answered rtt later, the store having read at; the answer is where
// its reading lies locally. Clocks that agree within the fastest round
// trip's bound are believed as they read; clocks the round trips prove
// apart are corrected by the least the bound requires; the place never
// leaves the call.
func TestStoreClockPlacesTheStoresNow(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := time.Millisecond
	type step struct {
		sent, rtt, at, want time.Duration // at and want after t0, on the store's and the local clock
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first answer: the clocks as they read", []step{
			{sent: 0, rtt: 4 * ms, at: 3 * ms, want: 3 * ms},
		}},
		{"same clock, legs of any length", []step{
			{sent: 0, rtt: 2 * ms, at: 1 * ms, want: 1 * ms},
			{sent: 10 * ms, rtt: 2 * ms, at: 11500 * time.Microsecond, want: 11500 * time.Microsecond},
			{sent: 20 * ms, rtt: 6 * ms, at: 21 * ms, want: 21 * ms},
		}},
		{"store a second ahead", []step{
			// Alone, the reading lies past the answer: kept at the answer.
			{sent: 0, rtt: 2 * ms, at: time.Second + ms, want: 2 * ms},
			// A fast round trip bounds the offset to [1s − 0.1ms, 1s + 0.1ms]:
			// the least correction, 1s − 0.1ms, places later readings.
			{sent: 10 * ms, rtt: 200 * time.Microsecond, at: time.Second + 10100*time.Microsecond, want: 10200 * time.Microsecond},
			{sent: 20 * ms, rtt: 2 * ms, at: time.Second + 21*ms, want: 21*ms + 100*time.Microsecond},
		}},
		{"store a second behind", []step{
			{sent: 0, rtt: 2 * ms, at: -time.Second + ms, want: 0},
			{sent: 10 * ms, rtt: 200 * time.Microsecond, at: -time.Second + 10100*time.Microsecond, want: 10 * ms},
			{sent: 20 * ms, rtt: 2 * ms, at: -time.Second + 21*ms, want: 21*ms - 100*time.Microsecond},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c storeClock
			for i, st := range tc.steps {
				sent := t0.Add(st.sent)
				recv := sent.Add(st.rtt)
				at := t0.Add(st.at)
				c.add(sent, recv, at)
				if got := c.local(sent, recv, at).Sub(t0); got != st.want {
					t.Errorf("step %d: the store's reading %v placed at %v, want %v", i, st.at, got, st.want)
				}
			}
		})
	}
}

// TestStoreClockKeepsTheLastSamples: the fastest round trip is looked for
// among the last clockSamples answers only, so a clock that steps is
// followed, and maxRTT forgets a slow answer as well.
func TestStoreClockKeepsTheLastSamples(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var c storeClock
	// One very fast answer from a store on the same clock, and one slow.
	c.add(t0, t0.Add(10*time.Microsecond), t0.Add(5*time.Microsecond))
	c.add(t0, t0.Add(50*time.Millisecond), t0.Add(25*time.Millisecond))
	if got := c.maxRTT(); got != 50*time.Millisecond {
		t.Fatalf("maxRTT = %v, want 50ms", got)
	}
	// The store's clock then steps a second ahead; answers take 2 ms.
	var sent time.Time
	for i := range clockSamples {
		sent = t0.Add(time.Duration(i+1) * 10 * time.Millisecond)
		c.add(sent, sent.Add(2*time.Millisecond), sent.Add(time.Second+time.Millisecond))
	}
	if got := c.maxRTT(); got != 2*time.Millisecond {
		t.Errorf("maxRTT = %v after %d answers of 2ms, want 2ms", got, clockSamples)
	}
	// Offset in [1s − 1ms, 1s + 1ms]: 1s − 1ms, so the reading of a
	// symmetric call lands at the answer.
	if got, want := c.local(sent, sent.Add(2*time.Millisecond), sent.Add(time.Second+time.Millisecond)), sent.Add(2*time.Millisecond); !got.Equal(want) {
		t.Errorf("after the step: placed at %v after the call, want %v", got.Sub(sent), want.Sub(sent))
	}
}
