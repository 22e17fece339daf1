package bucket_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
)

// TestLimitValidate: every bound of a limit, on both sides.
func TestLimitValidate(t *testing.T) {
	t.Parallel()
	horizon := (100 * 24 * time.Hour).Seconds() // burst/rate at most this
	for _, tc := range []struct {
		l     bucket.Limit
		field string // "" for valid
	}{
		{bucket.Limit{Rate: 20, Burst: 10}, ""},
		{bucket.Limit{Rate: math.NaN(), Burst: 1}, "rate"},
		{bucket.Limit{Rate: math.Inf(1), Burst: 1}, "rate"},
		{bucket.Limit{Rate: math.Inf(-1), Burst: 1}, "rate"},
		{bucket.Limit{Rate: 0, Burst: 1}, "rate"},
		{bucket.Limit{Rate: -1, Burst: 1}, "rate"},
		{bucket.Limit{Rate: bucket.MinRate, Burst: 1}, ""},
		{bucket.Limit{Rate: bucket.MinRate * 0.999, Burst: 1}, "rate"},
		{bucket.Limit{Rate: bucket.MaxRate, Burst: 1}, ""},
		{bucket.Limit{Rate: bucket.MaxRate * 1.001, Burst: 1}, "rate"},
		{bucket.Limit{Rate: 20, Burst: 0}, "burst"},
		{bucket.Limit{Rate: 20, Burst: -3}, "burst"},
		{bucket.Limit{Rate: 20, Burst: 1}, ""},
		{bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst}, ""},
		{bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst + 1}, "burst"},
		// burst/rate exactly the 100-day horizon, and just past it.
		// (1/16 per second, exact in binary: 540,000 jobs take 100 days.)
		{bucket.Limit{Rate: 0.0625, Burst: int(horizon / 16)}, ""},
		{bucket.Limit{Rate: 0.0625, Burst: int(horizon/16) + 1}, "burst"},
	} {
		err := tc.l.Validate()
		var le *bucket.LimitError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.l, err)
		case tc.field != "" && (!errors.As(err, &le) || le.Field != tc.field || !errors.Is(err, bucket.ErrInvalidLimit)):
			t.Errorf("%+v: %v, want an invalid %s", tc.l, err, tc.field)
		case tc.field != "" && !strings.HasPrefix(err.Error(), "bucket: invalid limit: "+tc.field+" "):
			t.Errorf("%+v: error text %q", tc.l, err)
		}
	}
}

// TestLimitValidateSaysWhy: a rate that is no positive number and one out
// of range are told apart.
func TestLimitValidateSaysWhy(t *testing.T) {
	t.Parallel()
	for rate, want := range map[float64]string{0: "greater than 0", -2: "greater than 0", bucket.MinRate / 2: "between"} {
		if err := (bucket.Limit{Rate: rate, Burst: 1}).Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rate %v: %v, want %q", rate, err, want)
		}
	}
}

// TestLimitDerived: period (rounded up to the nanosecond), tolerance and
// the string form.
func TestLimitDerived(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		l         bucket.Limit
		period    time.Duration
		tolerance time.Duration
		str       string
	}{
		{bucket.Limit{Rate: 20, Burst: 10}, 50 * time.Millisecond, 450 * time.Millisecond, "20/s burst 10"},
		{bucket.Limit{Rate: 3, Burst: 1}, 333333334, 0, "3/s burst 1"}, // rounded up, never faster
		{bucket.Limit{Rate: 0.5, Burst: 2}, 2 * time.Second, 2 * time.Second, "0.5/s burst 2"},
	} {
		if got := tc.l.Period(); got != tc.period {
			t.Errorf("%v: Period %v, want %v", tc.l, got, tc.period)
		}
		if got := tc.l.Tolerance(); got != tc.tolerance {
			t.Errorf("%v: Tolerance %v, want %v", tc.l, got, tc.tolerance)
		}
		if got := tc.l.String(); got != tc.str {
			t.Errorf("String %q, want %q", got, tc.str)
		}
	}
}

// TestPause: a pause pushes tat to until + τ, never back.
func TestPause(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_000_000, 0)
	l := bucket.Limit{Rate: 10, Burst: 3} // τ = 200 ms
	until := t0.Add(time.Second)
	for _, tc := range []struct {
		tat, want time.Time
	}{
		{t0, until.Add(200 * time.Millisecond)},                                // idle lane: empty bucket after the pause
		{until.Add(100 * time.Millisecond), until.Add(200 * time.Millisecond)}, // behind the pause's end
		{until.Add(200 * time.Millisecond), until.Add(200 * time.Millisecond)}, // at it
		{until.Add(900 * time.Millisecond), until.Add(900 * time.Millisecond)}, // a backlog reaching past it keeps its place
	} {
		if got := bucket.Pause(tc.tat, until, l); !got.Equal(tc.want) {
			t.Errorf("Pause(tat %v after t0) = %v after t0, want %v", tc.tat.Sub(t0), got.Sub(t0), tc.want.Sub(t0))
		}
	}
}

func TestKeyString(t *testing.T) {
	t.Parallel()
	if got := (bucket.Key{Lane: "mail"}).String(); got != "mail" {
		t.Errorf("lane key %q", got)
	}
	if got := (bucket.Key{Lane: "mail", Sub: "acme"}).String(); got != "mail/acme" {
		t.Errorf("sub key %q", got)
	}
}

// TestMemorySweepKeepsBusyStates: the periodic sweep (every 4096
// operations) drops idle states only; a lane with a backlog keeps its place.
func TestMemorySweepKeepsBusyStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := &bucket.Memory{Clock: clock.NewManual(time.Unix(1_000_000, 0))}
	l := bucket.Limit{Rate: 1, Burst: 1}
	busy := bucket.Key{Lane: "busy"}
	if _, err := m.Reserve(ctx, busy, l, 100); err != nil { // 100 s of slots ahead
		t.Fatal(err)
	}
	for i := range 5000 { // past one sweep
		if _, err := m.Admit(ctx, bucket.Key{Lane: "other", Sub: strconv.Itoa(i)}, l); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := m.Peek(ctx, busy, l); err != nil || d.Allowed || d.RetryAfter < 99*time.Second {
		t.Fatalf("after a sweep the busy lane reads %+v, %v: its backlog was dropped", d, err)
	}
}

// TestParseRateBounds: a rate of exactly the longest text taken, and a
// window of six digits, the most taken, both parse.
func TestParseRateBounds(t *testing.T) {
	t.Parallel()
	long := "20/s" + strings.Repeat(" ", 60) // 64 bytes
	if r, err := bucket.ParseRate(long); err != nil || r.PerSecond() != 20 {
		t.Errorf("ParseRate(%d bytes) = %v, %v", len(long), r, err)
	}
	if _, err := bucket.ParseRate(long + " "); err == nil {
		t.Errorf("ParseRate(%d bytes) took a text over the bound", len(long)+1)
	}
	if r, err := bucket.ParseRate("100000/100000s"); err != nil || r.PerSecond() != 1 {
		t.Errorf("ParseRate(100000/100000s) = %v, %v; want 1/s", r, err)
	}
	if _, err := bucket.ParseRate("1/1000000s"); err == nil {
		t.Error("a window of seven digits was taken")
	}
}

// TestQuotaWholeDay: a rate whose whole-count window is exactly a day is
// told per day.
func TestQuotaWholeDay(t *testing.T) {
	t.Parallel()
	r, err := bucket.ParseRate("0.5/12h")
	if err != nil {
		t.Fatal(err)
	}
	if n, per := r.Quota(); n != 1 || per != 24*time.Hour {
		t.Fatalf("0.5/12h reads as %v per %v, want 1 per 24h", n, per)
	}
}

// TestQuotaHugeLateness: a lateness bound whose product with the room just
// reaches the 128-bit division's limit is refused, not a panic.
func TestQuotaHugeLateness(t *testing.T) {
	t.Parallel()
	// room 2^36 × maxLate 2^28 s: the high word of the product is exactly
	// per (1 s in ns).
	q := bucket.Quota{Limit: 1<<36 + 1, Per: time.Second, Burst: 1}
	if _, err := q.Rate(time.Duration(1e9) << 28); err == nil {
		t.Fatal("a quota that leaves no room was taken")
	}
}

// TestRateUnmarshalEmpty: an empty JSON value is an error, not a panic.
func TestRateUnmarshalEmpty(t *testing.T) {
	t.Parallel()
	var r bucket.Rate
	if err := r.UnmarshalJSON(nil); err == nil {
		t.Fatal("an empty value was taken")
	}
}

// TestAdmitN: a request of n tokens is allowed only when the bucket holds
// all n (at exactly n it is), takes n periods, and says when it could be
// allowed otherwise; n = 1 is Admit, n = 0 takes nothing.
func TestAdmitN(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	l := bucket.Limit{Rate: 10, Burst: 5} // 100 ms a token
	now := time.Unix(1_000_000, 0)
	d, tat := bucket.AdmitN(now, time.Time{}, l, 3)
	if !d.Allowed || d.Remaining != 2 || d.RetryAfter != 0 || d.ResetAfter != 300*ms || !tat.Equal(now.Add(300*ms)) {
		t.Fatalf("3 of 5 from a full bucket: %+v, tat +%v", d, tat.Sub(now))
	}
	full := tat
	if d, next := bucket.AdmitN(now, full, l, 3); d.Allowed || d.Remaining != 0 || d.RetryAfter != 100*ms || d.ResetAfter != 300*ms || !next.Equal(full) {
		t.Fatalf("3 more with 2 left: %+v, tat +%v; want refused, retry after 100ms, state unchanged", d, next.Sub(now))
	}
	d, tat = bucket.AdmitN(now, full, l, 2)
	if !d.Allowed || d.Remaining != 0 || d.RetryAfter != 100*ms || d.ResetAfter != 500*ms || !tat.Equal(now.Add(500*ms)) {
		t.Fatalf("the last 2 of 5: %+v, tat +%v", d, tat.Sub(now))
	}
	owe := now.Add(600 * ms) // a period past empty
	if d, next := bucket.AdmitN(now, owe, l, 0); d.Allowed || d.RetryAfter != 100*ms || next != owe {
		t.Fatalf("nothing from a bucket a period past empty: %+v; want not allowed, retry after 100ms, state unchanged", d)
	}
	if d, next := bucket.AdmitN(now, full, l, 0); !d.Allowed || d.Remaining != 2 || next != full {
		t.Fatalf("nothing from a bucket with 2: %+v, want allowed with 2 left, state unchanged", d)
	}
	for _, tat := range []time.Time{{}, now.Add(-time.Second), now.Add(250 * ms), now.Add(400 * ms), now.Add(450 * ms)} {
		d1, n1 := bucket.AdmitN(now, tat, l, 1)
		d2, n2 := bucket.Admit(now, tat, l)
		if d1 != d2 || !n1.Equal(n2) {
			t.Errorf("tat %v: AdmitN(1) = %+v %v, Admit = %+v %v", tat, d1, n1, d2, n2)
		}
	}
}

// TestReservePairNext: after a pair reservation, KeyNext and LaneNext are
// the earliest starts each state grants next, counting its burst (a state
// with room left grants one at once); a key whose next start is exactly
// the allowed lead after the lane's takes its slot.
func TestReservePairNext(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	now := time.Unix(1_000_000, 0)
	ll := bucket.Limit{Rate: 10, Burst: 2} // 100 ms a slot, τ 100 ms
	kl := bucket.Limit{Rate: 1, Burst: 3}  // 1 s a slot, τ 2 s
	var laneTat, keyTat time.Time
	for i, want := range []bucket.PairReservation{
		// KeyLatest: each slot's theoretical time in the key's state, a
		// period apart (the burst lets them start earlier).
		{OK: true, Due: 0, Free: true, KeyNext: 0, LaneNext: 0, KeyLatest: 0},
		{OK: true, Due: 0, Free: true, KeyNext: 0, LaneNext: 100 * ms, KeyLatest: time.Second},
		{OK: true, Due: 100 * ms, KeyNext: time.Second, LaneNext: 200 * ms, KeyLatest: 2 * time.Second},
	} {
		var r bucket.PairReservation
		r, laneTat, keyTat = bucket.ReservePair(now, laneTat, keyTat, ll, kl, 0, 0)
		if r != want {
			t.Fatalf("reservation %d: %+v, want %+v", i, r, want)
		}
	}
	// The key's next start 10 ms after the lane's (idle) one: taken with a
	// lead of exactly 10 ms, refused with 9 ms.
	one := bucket.Limit{Rate: 1, Burst: 1}
	keyTat = now.Add(10 * ms)
	if r, _, _ := bucket.ReservePair(now, time.Time{}, keyTat, ll, one, 10*ms, 0); !r.OK || r.Due != 10*ms {
		t.Fatalf("a lead of exactly ahead: %+v, want the slot at 10ms", r)
	}
	if r, _, _ := bucket.ReservePair(now, time.Time{}, keyTat, ll, one, 9*ms, 0); r.OK || r.KeyNext != 10*ms || r.LaneNext != 0 {
		t.Fatalf("a lead over ahead: %+v, want refused, key next in 10ms", r)
	}
}
