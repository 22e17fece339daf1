package bucket_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

func TestParseRate(t *testing.T) {
	steps := []struct {
		in        string
		canonical string
		perSecond float64
	}{
		{"20", "20/s", 20},
		{"0.5", "0.5/s", 0.5},
		{".5", "0.5/s", 0.5},
		{"5.", "5/s", 5},
		{"020.500", "20.5/s", 20.5},
		{"0", "0/s", 0},
		{"1e6", "1000000/s", 1e6},
		{"1e+06", "1000000/s", 1e6},
		{"2.5E-1", "0.25/s", 0.25},
		{"0.000001", "0.000001/s", 1e-6},
		{"20/s", "20/s", 20},
		{"20/sec", "20/s", 20},
		{"20/second", "20/s", 20},
		{"20/seconds", "20/s", 20},
		{"120/min", "120/min", 2},
		{"5/m", "5/min", 5.0 / 60},
		{"5/minute", "5/min", 5.0 / 60},
		{"1000/h", "1000/h", 1000.0 / 3600},
		{"1000/hour", "1000/h", 1000.0 / 3600},
		{"2/d", "2/d", 2.0 / 86400},
		{"2/day", "2/d", 2.0 / 86400},
		{"20 / s", "20/s", 20},
		{"  20/  min ", "20/min", 20.0 / 60},
		{"900/15min", "900/15min", 1},
		{"100 / 10 s", "100/10s", 10},
		{"60/60s", "60/min", 1},
		{"3600/3600s", "3600/h", 1},
		{"1/90min", "1/90min", 1.0 / 5400},
		{"1/48h", "1/2d", 1.0 / 172800},
		{"7/366d", "7/366d", 7.0 / (366 * 86400)},
		{"999999999999.999999/s", "999999999999.999999/s", 999999999999.999999},
	}
	for _, s := range steps {
		t.Run(s.in, func(t *testing.T) {
			r, err := bucket.ParseRate(s.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.String(); got != s.canonical {
				t.Errorf("String() = %q, want %q", got, s.canonical)
			}
			if got := r.PerSecond(); math.Abs(got-s.perSecond) > 1e-12*s.perSecond {
				t.Errorf("PerSecond() = %v, want %v", got, s.perSecond)
			}
			back, err := bucket.ParseRate(r.String())
			if err != nil || back != r {
				t.Errorf("ParseRate(%q) = %v, %v; want the same rate back", r.String(), back, err)
			}
			if r.IsZero() != (s.perSecond == 0) {
				t.Errorf("IsZero() = %v", r.IsZero())
			}
		})
	}
}

func TestParseRateErrors(t *testing.T) {
	steps := []struct{ in, want string }{
		{"", "no count"},
		{"/s", "no count"},
		{"-1", "the count is negative"},
		{"-1/s", "the count is negative"},
		{"+1", "not a plain decimal number"},
		{"abc", "not a plain decimal number"},
		{"1,5", "not a plain decimal number"},
		{".", "not a plain decimal number"},
		{"NaN", "not a plain decimal number"},
		{"Inf", "not a plain decimal number"},
		{"0x10", "not a plain decimal number"},
		{"1_000", "not a plain decimal number"},
		{"1e", "exponent"},
		{"1e1000", "exponent"},
		{"1e+-3", "exponent"},
		{"1e400", "more than 12 digits before the point"},
		{"1e-7", "more than 6 decimal places"},
		{"0.0000001", "more than 6 decimal places"},
		{"1000000000000", "more than 12 digits"},
		{"20/", "no unit"},
		{"20/ ", "no unit"},
		{"20/w", `unknown unit "w"`},
		{"20/S", `unknown unit "S"`},
		{"20/ms", `unknown unit "ms"`},
		{"20/1.5h", `unknown unit ".5h"`},
		{"20/s/s", `unknown unit "s/s"`},
		{"20/0s", "whole number of units from 1"},
		{"20/1000000s", "whole number of units from 1"},
		{"20/367d", "longer than 366 days"},
		{"20/9000h", "longer than 366 days"},
		{"20 per second", "not a plain decimal number"},
		{strings.Repeat("1", 65), "longer than 64 bytes"},
	}
	for _, s := range steps {
		t.Run(s.in, func(t *testing.T) {
			_, err := bucket.ParseRate(s.in)
			var re *bucket.RateError
			if !errors.As(err, &re) || !errors.Is(err, bucket.ErrInvalidRate) {
				t.Fatalf("err = %v, want a *RateError matching ErrInvalidRate", err)
			}
			if !strings.Contains(err.Error(), s.want) || !strings.Contains(err.Error(), "like 20/s, 120/min, 1000/h") {
				t.Errorf("err = %q, want it to contain %q and the expected form", err, s.want)
			}
			if len(re.Text) > 64 {
				t.Errorf("Text is %d bytes", len(re.Text))
			}
		})
	}
}

func TestRateQuota(t *testing.T) {
	steps := []struct {
		in     string
		count  float64
		window time.Duration
	}{
		{"20", 20, time.Second},
		{"20/s", 20, time.Second},
		{"0.5", 1, 2 * time.Second},
		{"2.5", 5, 2 * time.Second},
		{"0.25/h", 1, 4 * time.Hour},
		{"120/min", 120, time.Minute},
		{"1000/h", 1000, time.Hour},
		{"900/15min", 900, 15 * time.Minute},
		{"2.5/min", 1, 24 * time.Second},
		{"1.5/d", 1, 57600 * time.Second},
		{"0.75", 3, 4 * time.Second},
		{"0.001", 1, 1000 * time.Second},
		{"0.000001", 0.000001, time.Second}, // the whole-count window is 11.6 days: over a day
		{"0.333333", 0.333333, time.Second}, // 333333 per 1000000s
		{"0.5/d", 0.5, 24 * time.Hour},
	}
	for _, s := range steps {
		t.Run(s.in, func(t *testing.T) {
			r, err := bucket.ParseRate(s.in)
			if err != nil {
				t.Fatal(err)
			}
			count, window := r.Quota()
			if count != s.count || window != s.window {
				t.Fatalf("Quota() = %v per %v, want %v per %v", count, window, s.count, s.window)
			}
			if got := count / window.Seconds(); math.Abs(got-r.PerSecond()) > 1e-12*r.PerSecond() {
				t.Errorf("%v per %v is %v/s, the rate is %v/s", count, window, got, r.PerSecond())
			}
		})
	}
	// Every whole-second window below the one chosen holds a fractional count.
	r, _ := bucket.ParseRate("2.5/min")
	for w := 1; w < 24; w++ {
		if c := r.PerSecond() * float64(w); math.Abs(c-math.Round(c)) < 1e-9 {
			t.Errorf("window %ds holds a whole count %v: Quota is not the smallest", w, c)
		}
	}
}

func TestRateJSON(t *testing.T) {
	var v struct {
		Rate *bucket.Rate `json:"rate"`
	}
	for in, want := range map[string]string{
		`{"rate": 50}`:        "50/s",
		`{"rate": 0.5}`:       "0.5/s",
		`{"rate": 1e3}`:       "1000/s",
		`{"rate": "50/s"}`:    "50/s",
		`{"rate": "120/min"}`: "120/min",
		`{"rate": " 5 / m "}`: "5/min",
	} {
		v.Rate = nil
		if err := json.Unmarshal([]byte(in), &v); err != nil || v.Rate == nil || v.Rate.String() != want {
			t.Errorf("%s: rate %v, err %v; want %s", in, v.Rate, err, want)
		}
	}
	for _, in := range []string{`{"rate": -5}`, `{"rate": "fast"}`, `{"rate": "20/w"}`, `{"rate": true}`, `{"rate": [1]}`, `{"rate": {}}`} {
		v.Rate = nil
		if err := json.Unmarshal([]byte(in), &v); err == nil {
			t.Errorf("%s: accepted as %v", in, v.Rate)
		}
	}
	v.Rate = nil
	if err := json.Unmarshal([]byte(`{"rate": null}`), &v); err != nil || v.Rate != nil {
		t.Errorf("null: %v %v", v.Rate, err)
	}
}

// maxLate is the drain's lateness bound the derivation is tested with
// (leaky.DefaultMaxLate; package bucket cannot import the drain).
const maxLate = 2 * time.Millisecond

func TestQuotaRate(t *testing.T) {
	steps := []struct {
		q    bucket.Quota
		want string // the derived rate, or part of the error
	}{
		{bucket.Quota{Limit: 1000, Per: time.Hour, Burst: 50}, "949/h"},
		{bucket.Quota{Limit: 1000, Per: time.Hour, Burst: 1}, "998/h"},
		{bucket.Quota{Limit: 10, Per: time.Second, Burst: 1}, "8/s"},
		{bucket.Quota{Limit: 900, Per: 15 * time.Minute, Burst: 10}, "889/15min"},
		{bucket.Quota{Limit: 3, Per: time.Second, Burst: 1}, "1/s"},
		// Periods below 2 ms: the lateness bound is 2 ms, worth more than one start.
		{bucket.Quota{Limit: 100_000, Per: time.Minute, Burst: 1}, "99995/min"}, // k = ⌈99999·2ms/60s⌉ = 4
		{bucket.Quota{Limit: 5000, Per: time.Second, Burst: 100}, "4890/s"},     // k = ⌈4900·2ms/1s⌉ = 10
		{bucket.Quota{Limit: 500, Per: time.Second, Burst: 1}, "498/s"},         // k = ⌈499·2ms/1s⌉ = 1
		{bucket.Quota{Limit: 2, Per: time.Second, Burst: 1}, "leaves no room"},
		{bucket.Quota{Limit: 50, Per: time.Hour, Burst: 49}, "leaves no room"},
		{bucket.Quota{Limit: 50, Per: time.Hour, Burst: 51}, "burst must be from 1 to the limit 50, got 51"},
		{bucket.Quota{Limit: 50, Per: time.Hour, Burst: 0}, "burst must be from 1 to the limit 50, got 0"},
		{bucket.Quota{Limit: 0, Per: time.Hour, Burst: 1}, "limit must be from 1"},
		{bucket.Quota{Limit: 50, Per: 1500 * time.Millisecond, Burst: 1}, "whole number of seconds"},
		{bucket.Quota{Limit: 50, Per: 0, Burst: 1}, "whole number of seconds"},
		{bucket.Quota{Limit: 50, Per: 367 * 24 * time.Hour, Burst: 1}, "366 days"},
		// Each bound taken exactly: the largest limit over the longest window,
		// a limit of 1, and a burst equal to the limit (both leave no room).
		{bucket.Quota{Limit: 999_999_999_999, Per: 366 * 24 * time.Hour, Burst: 1}, "999999999934/366d"}, // k = ⌈999999999998·2ms/366d⌉ = 64
		{bucket.Quota{Limit: 1_000_000_000_000, Per: time.Hour, Burst: 1}, "limit must be from 1 to 999999999999"},
		{bucket.Quota{Limit: 1, Per: time.Hour, Burst: 1}, "leaves no room"},
		{bucket.Quota{Limit: 50, Per: time.Hour, Burst: 50}, "leaves no room"},
	}
	for _, s := range steps {
		t.Run(quotaName(s.q), func(t *testing.T) {
			r, err := s.q.Rate(maxLate)
			if err != nil {
				var le *bucket.LimitError
				if !errors.As(err, &le) || !errors.Is(err, bucket.ErrInvalidLimit) || !strings.Contains(err.Error(), s.want) {
					t.Fatalf("err = %v, want a *LimitError containing %q", err, s.want)
				}
				return
			}
			if r.String() != s.want {
				t.Fatalf("Rate = %s, want %s", r, s.want)
			}
			if period := time.Duration(float64(time.Second) / r.PerSecond()); period >= maxLate {
				// In the one-start regime the derivation is (limit − burst − 1)/per.
				want := float64(s.q.Limit-int64(s.q.Burst)-1) / s.q.Per.Seconds()
				if math.Abs(r.PerSecond()-want) > 1e-12*want {
					t.Errorf("PerSecond = %v, want (limit - burst - 1)/per = %v", r.PerSecond(), want)
				}
			}
		})
	}
}

// TestQuotaNeverExceeded simulates a lane paced by GCRA at a derived rate:
// bursts of arrivals take tokens with Admit, the rest get slots from
// Reserve in batches, and every job starts up to max(maxLate, period) after
// its slot (the drain's bound). No closed window of length per may hold
// more than limit starts. The same simulation at rate (limit − burst)/per,
// without the margin, must find a window over the limit: the margin is
// needed.
func TestQuotaNeverExceeded(t *testing.T) {
	quotas := []bucket.Quota{
		{Limit: 10, Per: time.Second, Burst: 1},
		{Limit: 10, Per: time.Second, Burst: 5},
		{Limit: 60, Per: time.Minute, Burst: 10},
		{Limit: 1000, Per: time.Hour, Burst: 50},
		{Limit: 900, Per: 15 * time.Minute, Burst: 1},
		{Limit: 3, Per: time.Second, Burst: 1},
		{Limit: 12, Per: time.Second, Burst: 1}, // 10/s: a whole-nanosecond period, the tight case
		{Limit: 600, Per: time.Second, Burst: 20},
		// Periods below 2 ms: the margin is more than one start.
		{Limit: 5000, Per: time.Second, Burst: 100},
		{Limit: 20_000, Per: 10 * time.Second, Burst: 1},
	}
	for i, q := range quotas {
		t.Run(quotaName(q), func(t *testing.T) {
			t.Parallel() // pure simulations; the slowest take seconds each
			r, err := q.Rate(maxLate)
			if err != nil {
				t.Fatal(err)
			}
			lim := bucket.Limit{Rate: r.PerSecond(), Burst: q.Burst}
			if err := lim.Validate(); err != nil {
				t.Fatal(err)
			}
			seeds := uint64(10)
			if q.Limit > 1000 {
				seeds = 3
			}
			for seed := range seeds {
				starts := simulate(lim, q, rand.New(rand.NewPCG(uint64(i), seed)))
				if most, at := busiestWindow(starts, q.Per); most > int(q.Limit) {
					t.Fatalf("seed %d: %d starts in the window of %v from %v (%d starts in all), limit %d", seed, most, q.Per, at, len(starts), q.Limit)
				}
			}
		})
	}
	t.Run("without margin", func(t *testing.T) {
		t.Parallel()
		// 10/s: a whole-nanosecond period, so that on-time slots alone fill
		// a closed window to the limit and one late start tips it over.
		q := bucket.Quota{Limit: 11, Per: time.Second, Burst: 1}
		lim := bucket.Limit{Rate: float64(q.Limit-int64(q.Burst)) / q.Per.Seconds(), Burst: q.Burst}
		worst := 0
		for seed := range uint64(10) {
			most, _ := busiestWindow(simulate(lim, q, rand.New(rand.NewPCG(99, seed))), q.Per)
			worst = max(worst, most)
		}
		if worst <= int(q.Limit) {
			t.Errorf("at (limit - burst)/per the busiest window holds %d starts: the simulation never finds the late start the margin is for", worst)
		}
	})
}

// simulate runs rounds of arrivals (up to enough to fill a window of the
// quota at once) and drains against lim and returns the start times. A
// start is its slot plus a lateness of 0, the whole bound
// max(maxLate, period), or something in between.
func simulate(lim bucket.Limit, q bucket.Quota, rng *rand.Rand) []time.Time {
	per := q.Per
	bound := max(maxLate, lim.Period())
	late := func() time.Duration {
		switch rng.IntN(3) {
		case 0:
			return 0
		case 1:
			return bound
		}
		return time.Duration(rng.Int64N(int64(bound) + 1))
	}
	now := time.Unix(1_000_000_000, 0)
	var tat time.Time
	var starts []time.Time
	for range 30 {
		queued := 0
		for range rng.IntN(int(q.Limit) + lim.Burst + 3) {
			d, next := bucket.Admit(now, tat, lim)
			if !d.Allowed {
				queued++
				continue
			}
			tat = next
			starts = append(starts, now.Add(late()))
		}
		for queued > 0 {
			n := min(queued, 1+rng.IntN(8))
			res, next := bucket.Reserve(now, tat, lim, n)
			tat = next
			for i := range n {
				starts = append(starts, now.Add(res.Delay(i)+late()))
			}
			now = now.Add(res.Delay(n - 1)) // the drain waits for its last slot
			queued -= n
		}
		switch rng.IntN(3) { // then an idle gap: none, part of a window, or a full refill
		case 1:
			now = now.Add(time.Duration(rng.Int64N(int64(per))))
		case 2:
			now = now.Add(per + lim.Tolerance() + lim.Period())
		}
	}
	return starts
}

// busiestWindow returns the most starts in a closed window of length per,
// and where that window begins.
func busiestWindow(starts []time.Time, per time.Duration) (int, time.Time) {
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	most, at, j := 0, time.Time{}, 0
	for i, s := range starts {
		for j < len(starts) && !starts[j].After(s.Add(per)) {
			j++
		}
		if j-i > most {
			most, at = j-i, s
		}
	}
	return most, at
}

func quotaName(q bucket.Quota) string {
	return fmt.Sprintf("%d per %v burst %d", q.Limit, q.Per, q.Burst)
}

// TestQuotaRateLateness: a lateness bound of zero is taken (one start of
// margin, k = 1); a negative one is refused.
func TestQuotaRateLateness(t *testing.T) {
	t.Parallel()
	q := bucket.Quota{Limit: 100_000, Per: time.Minute, Burst: 1}
	if r, err := q.Rate(0); err != nil || r.String() != "99998/min" {
		t.Errorf("Rate(0) = %v, %v; want 99998/min", r, err)
	}
	if _, err := q.Rate(-time.Nanosecond); err == nil || !strings.Contains(err.Error(), "negative lateness bound") {
		t.Errorf("Rate(-1ns) = %v, want the negative lateness bound refused", err)
	}
}
