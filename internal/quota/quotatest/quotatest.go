// Package quotatest is the conformance suite every quota.Limiter passes:
// the in-memory limiter and the Redis one run the same steps against an
// injected clock, so the two cannot drift apart.
package quotatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
)

// New makes a fresh limiter that reads its time from c. Each call must
// return a limiter with empty state (a new key space).
type New func(t *testing.T, c *clock.Manual) quota.Limiter

// t0 is a whole minute, so that a 1m window starts at t0.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// Run runs every conformance test against limiters made by newLimiter.
func Run(t *testing.T, newLimiter New) {
	t.Run("PlanTenPerMinute", func(t *testing.T) { planTenPerMinute(t, newLimiter) })
	t.Run("PlanCost", func(t *testing.T) { planCost(t, newLimiter) })
	t.Run("PerIPSlidingWindow", func(t *testing.T) { perIPSlidingWindow(t, newLimiter) })
	t.Run("IPRefusalSkipsPlan", func(t *testing.T) { ipRefusalSkipsPlan(t, newLimiter) })
	t.Run("CostOverBurst", func(t *testing.T) { costOverBurst(t, newLimiter) })
	t.Run("PlanChange", func(t *testing.T) { planChange(t, newLimiter) })
}

func check(t *testing.T, l quota.Limiter, r quota.Request) quota.Result {
	t.Helper()
	res, err := l.Check(context.Background(), r)
	if err != nil {
		t.Fatalf("Check(%+v): %v", r, err)
	}
	return res
}

// planTenPerMinute: 10/min burst 10 admits 10 at once, refuses the 11th
// with a retry of 6s, and admits one more 6s later.
func planTenPerMinute(t *testing.T, newLimiter New) {
	c := clock.NewManual(t0)
	l := newLimiter(t, c)
	r := quota.Request{Caller: "key:shop", Plan: bucket.Limit{Rate: 10.0 / 60, Burst: 10}, Cost: 1}
	for i := range 10 {
		res := check(t, l, r)
		if !res.PlanChecked || !res.Plan.Allowed || res.Plan.Remaining != 9-i {
			t.Fatalf("request %d: %+v, want allowed with %d left", i+1, res, 9-i)
		}
	}
	res := check(t, l, r)
	if res.Plan.Allowed || res.Plan.RetryAfter != 6*time.Second {
		t.Fatalf("11th: %+v, want refused with retry 6s", res.Plan)
	}
	c.Advance(5999 * time.Millisecond)
	if res := check(t, l, r); res.Plan.Allowed {
		t.Fatalf("at 5.999s: %+v, want refused", res.Plan)
	}
	c.Advance(time.Millisecond)
	if res := check(t, l, r); !res.Plan.Allowed || res.Plan.Remaining != 0 {
		t.Fatalf("at 6s: %+v, want allowed with none left", res.Plan)
	}
	// Cost 0 reads the state and takes nothing.
	if res := check(t, l, quota.Request{Caller: r.Caller, Plan: r.Plan}); res.Plan.Remaining != 0 || res.Plan.RetryAfter != 6*time.Second {
		t.Fatalf("peek: %+v", res.Plan)
	}
}

// planCost: a request of cost n takes n tokens, or none when they are not
// all there.
func planCost(t *testing.T, newLimiter New) {
	c := clock.NewManual(t0)
	l := newLimiter(t, c)
	r := quota.Request{Caller: "key:batch", Plan: bucket.Limit{Rate: 1, Burst: 10}, Cost: 4}
	for i, want := range []bool{true, true, false} {
		if res := check(t, l, r); res.Plan.Allowed != want {
			t.Fatalf("step %d: %+v, want allowed=%v", i, res.Plan, want)
		}
	}
	// 2 tokens left: a cost of 4 waits 2s, a cost of 2 goes now.
	if res := check(t, l, r); res.Plan.RetryAfter != 2*time.Second {
		t.Fatalf("retry %v, want 2s", res.Plan.RetryAfter)
	}
	r.Cost = 2
	if res := check(t, l, r); !res.Plan.Allowed || res.Plan.Remaining != 0 {
		t.Fatalf("cost 2: %+v", res.Plan)
	}
}

// perIPSlidingWindow: 120 per minute; the 121st in the first window is
// refused; in the next window the previous count weighs by what is left of
// it.
func perIPSlidingWindow(t *testing.T, newLimiter New) {
	c := clock.NewManual(t0)
	l := newLimiter(t, c)
	r := quota.Request{IP: "192.0.2.7", PerIP: quota.Window{Limit: 120, Length: time.Minute}}
	for i := range 120 {
		if res := check(t, l, r); !res.IPChecked || !res.IP.Allowed || res.IP.Remaining != int64(119-i) {
			t.Fatalf("request %d: %+v", i+1, res.IP)
		}
	}
	res := check(t, l, r)
	// The next fits once 1 of 120 in the next window has decayed: 60s + 0.5s.
	if res.IP.Allowed || res.IP.RetryAfter != 60500*time.Millisecond {
		t.Fatalf("121st: %+v, want refused, retry 60.5s", res.IP)
	}
	// Another IP is not affected.
	if res := check(t, l, quota.Request{IP: "192.0.2.8", PerIP: r.PerIP}); !res.IP.Allowed {
		t.Fatalf("other IP refused: %+v", res.IP)
	}
	// 45s into the next window the previous 120 weigh 30: 90 more fit.
	c.Advance(time.Minute + 45*time.Second)
	for i := range 90 {
		if res := check(t, l, r); !res.IP.Allowed {
			t.Fatalf("next window, request %d refused: %+v", i+1, res.IP)
		}
	}
	if res := check(t, l, r); res.IP.Allowed {
		t.Fatalf("next window, 91st allowed: %+v", res.IP)
	}
	// Two windows later nothing remains.
	c.Advance(2 * time.Minute)
	if res := check(t, l, r); !res.IP.Allowed || res.IP.Remaining != 119 {
		t.Fatalf("after two windows: %+v", res.IP)
	}
}

// ipRefusalSkipsPlan: a request the IP layer refuses takes no token, unless
// the IP layer is observed.
func ipRefusalSkipsPlan(t *testing.T, newLimiter New) {
	c := clock.NewManual(t0)
	l := newLimiter(t, c)
	r := quota.Request{IP: "2001:db8::/64", PerIP: quota.Window{Limit: 1, Length: time.Minute},
		Caller: "ip:2001:db8::/64", Plan: bucket.Limit{Rate: 1, Burst: 5}, Cost: 1}
	if res := check(t, l, r); !res.IP.Allowed || !res.Plan.Allowed || res.Plan.Remaining != 4 {
		t.Fatalf("first: %+v", res)
	}
	if res := check(t, l, r); res.IP.Allowed || res.PlanChecked {
		t.Fatalf("second: %+v, want refused by IP, plan unchecked", res)
	}
	r.ObserveIP = true
	if res := check(t, l, r); res.IP.Allowed || !res.PlanChecked || res.Plan.Remaining != 3 {
		t.Fatalf("observed: %+v, want IP refused and plan checked with 3 left", res)
	}
}

func costOverBurst(t *testing.T, newLimiter New) {
	l := newLimiter(t, clock.NewManual(t0))
	_, err := l.Check(context.Background(), quota.Request{Caller: "key:x", Plan: bucket.Limit{Rate: 1, Burst: 2}, Cost: 3})
	if err == nil || fmt.Sprint(err) == "" {
		t.Fatal("cost over burst accepted")
	}
}

// planChange: a caller moved from a strict plan to a generous one is held
// by the generous one from the next request (its state is at most an
// empty bucket of the new plan).
func planChange(t *testing.T, newLimiter New) {
	c := clock.NewManual(t0)
	l := newLimiter(t, c)
	r := quota.Request{Caller: "key:up", Plan: bucket.Limit{Rate: 1.0 / 3600, Burst: 1}, Cost: 1}
	check(t, l, r)
	if res := check(t, l, r); res.Plan.Allowed || res.Plan.RetryAfter != time.Hour {
		t.Fatalf("second on 1/h: %+v", res.Plan)
	}
	r.Plan = bucket.Limit{Rate: 10, Burst: 1}
	if res := check(t, l, r); res.Plan.Allowed || res.Plan.RetryAfter != 100*time.Millisecond {
		t.Fatalf("on 10/s: %+v, want refused for one period", res.Plan)
	}
	c.Advance(100 * time.Millisecond)
	if res := check(t, l, r); !res.Plan.Allowed {
		t.Fatalf("on 10/s a period later: %+v", res.Plan)
	}
}
