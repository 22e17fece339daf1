package dispatch

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// Fixed times for the step tables.
var (
	t0 = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	t1 = t0.Add(3 * time.Second)
	t2 = t0.Add(-10 * time.Second)
	t9 = t0.Add(2 * MaxPause)
)

func TestParseRetryAfter(t *testing.T) {
	steps := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"2", 2 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, false},
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false}, // RFC 9110: delta-seconds is digits only
		{"abc", 0, false},
		{"7200", MaxPause, true},
		{"99999999999999999999999", MaxPause, true},
		{t1.Format(http.TimeFormat), 3 * time.Second, true},
		{t2.Format(http.TimeFormat), 0, false}, // in the past
		{t9.Format(http.TimeFormat), MaxPause, true},
		{t1.Format(time.RFC850), 3 * time.Second, true}, // obsolete form http.ParseTime takes
		{"Fri, 32 Mar 2025 00:00:00 GMT", 0, false},
	}
	for _, s := range steps {
		t.Run(s.in, func(t *testing.T) {
			got, ok := parseRetryAfter(s.in, t0)
			if got != s.want || ok != s.wantOK {
				t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", s.in, got, ok, s.want, s.wantOK)
			}
		})
	}
}

func TestParseReset(t *testing.T) {
	steps := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"5", 5 * time.Second, true},
		{"0.25", 250 * time.Millisecond, true},
		{"0", 0, false},
		{"", 0, false},
		{"-3", 0, false},
		{"+3", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"1e3", 1000 * time.Second, true},
		{"junk", 0, false},
		{"86400", MaxPause, true},
		// Above 1e9: a Unix timestamp in seconds.
		{itoa(t1.Unix()), 3 * time.Second, true},
		{itoa(t2.Unix()), 0, false},
		{itoa(t9.Unix()), MaxPause, true},
		// Above 1e12: a Unix timestamp in milliseconds.
		{itoa(t0.Add(1500 * time.Millisecond).UnixMilli()), 1500 * time.Millisecond, true},
	}
	for _, s := range steps {
		t.Run(s.in, func(t *testing.T) {
			got, ok := parseReset(s.in, t0)
			if got != s.want || ok != s.wantOK {
				t.Errorf("parseReset(%q) = %v, %v; want %v, %v", s.in, got, ok, s.want, s.wantOK)
			}
		})
	}
}

func TestParseRateLimit(t *testing.T) {
	steps := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{`"default";r=0;t=7`, 7 * time.Second, true},
		{`"default";r=5;t=7`, 0, false},
		{`"default";r=0`, 0, false},
		{`"default";t=7`, 0, false},
		{`"default";r=0;t=-7`, 0, false},
		{`"default";r=0;t=x`, 0, false},
		{`"default" ; r=0 ; t=7`, 7 * time.Second, true},
		{`"burst";r=0;t=5, "day";r=10;t=80000`, 5 * time.Second, true},
		{`"burst";r=0;t=5, "hour";r=0;t=60`, time.Minute, true},
		{`"a,b;c";r=0;t=4`, 4 * time.Second, true}, // separators inside the quoted name
		{`default;r=0;t=9`, 9 * time.Second, true}, // token instead of string
		{`"default";r=0;t=999999`, MaxPause, true},
		{`limit=100, remaining=0, reset=10`, 10 * time.Second, true},
		{`limit=100, remaining=3, reset=10`, 0, false},
		{`remaining=0`, 0, false},
		{`reset=10, remaining=0`, 10 * time.Second, true},
		{``, 0, false},
		{`garbage`, 0, false},
		{`;;,,=`, 0, false},
	}
	for _, s := range steps {
		t.Run(s.in, func(t *testing.T) {
			got, ok := parseRateLimit(s.in)
			if got != s.want || ok != s.wantOK {
				t.Errorf("parseRateLimit(%q) = %v, %v; want %v, %v", s.in, got, ok, s.want, s.wantOK)
			}
		})
	}
}

func TestDownstreamSignals(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	steps := []struct {
		name                string
		status              int
		header              http.Header
		wantRetry, wantWait time.Duration
	}{
		{"429 Retry-After", 429, h("Retry-After", "2"), 2 * time.Second, 2 * time.Second},
		{"503 HTTP-date", 503, h("Retry-After", t1.Format(http.TimeFormat)), 3 * time.Second, 3 * time.Second},
		{"500 ignores Retry-After", 500, h("Retry-After", "2"), 0, 0},
		{"200 ignores Retry-After", 200, h("Retry-After", "2"), 0, 0},
		{"X-RateLimit on 200", 200, h("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "5"), 0, 5 * time.Second},
		{"X-RateLimit epoch", 200, h("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", itoa(t1.Unix())), 0, 3 * time.Second},
		{"X-RateLimit remaining left", 200, h("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "5"), 0, 0},
		{"X-RateLimit no reset", 200, h("X-RateLimit-Remaining", "0"), 0, 0},
		{"older draft separate headers", 200, h("RateLimit-Remaining", "0", "RateLimit-Reset", "6"), 0, 6 * time.Second},
		{"RateLimit structured", 200, h("RateLimit", `"default";r=0;t=7`), 0, 7 * time.Second},
		{"RateLimit two lines", 200, h("RateLimit", `"a";r=1;t=70`, "RateLimit", `"b";r=0;t=8`), 0, 8 * time.Second},
		{"longest wins", 429, h("Retry-After", "2", "RateLimit", `"default";r=0;t=7`), 2 * time.Second, 7 * time.Second},
		{"garbage", 429, h("Retry-After", "soon", "X-RateLimit-Remaining", "none", "RateLimit", "??"), 0, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			retry, wait := downstreamSignals(s.status, s.header, t0)
			if retry != s.wantRetry || wait != s.wantWait {
				t.Errorf("downstreamSignals = retry %v, pause %v; want %v, %v", retry, wait, s.wantRetry, s.wantWait)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
