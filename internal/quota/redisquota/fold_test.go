package redisquota_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/redisquota"
	"github.com/throttler/throttler/internal/testenv"
)

// space is one key space: a lane store and a quota store on it, sharing
// one clock (nil: Redis TIME).
type space struct {
	prefix string
	lanes  *redisbucket.Store
	quotas *redisquota.Store
}

func newSpace(c *redis.Client, clk clock.Clock, fold bool) space {
	p := "f" + strconv.FormatInt(prefixes.Add(1), 10)
	sp := space{prefix: p, lanes: redisbucket.New(c, redisbucket.Config{Prefix: p, Clock: clk})}
	cfg := redisquota.Config{Prefix: p, Clock: clk}
	if fold {
		cfg.Lanes = sp.lanes
	}
	sp.quotas = redisquota.New(c, cfg)
	return sp
}

// foldStart is the time of the manual clocks of these tests.
var foldStart = time.Date(2026, 12, 1, 12, 0, 30, 0, time.UTC)

// reservedLane starts a redis-server and a folded space on it (clk nil:
// Redis TIME) whose lane "l" has n slots of laneLim taken (none when n is 0).
func reservedLane(t *testing.T, clk clock.Clock, laneLim bucket.Limit, n int) (*redis.Client, space) {
	t.Helper()
	c := client(t, testenv.StartRedis(t).URL())
	sp := newSpace(c, clk, true)
	if n == 0 {
		return c, sp
	}
	if _, err := sp.lanes.Reserve(context.Background(), bucket.Key{Lane: "l"}, laneLim, n); err != nil {
		t.Fatal(err)
	}
	return c, sp
}

// layered is a request through both layers (the per-IP window, 3 a minute,
// and the plan, rate 1 burst 2) to lane "l" at laneLim.
func layered(laneLim bucket.Limit) quota.Request {
	return quota.Request{IP: "198.51.100.7", PerIP: quota.Window{Limit: 3, Length: time.Minute}, Caller: "key:a",
		Plan: bucket.Limit{Rate: 1, Burst: 2}, Cost: 1, Lane: bucket.Key{Lane: "l"}, LaneLimit: laneLim}
}

// keyState is a key's value ("" when missing) and when it expires (Redis
// PEXPIRETIME, ms since the epoch; -2 missing, -1 never).
type keyState struct {
	v   string
	exp int64
}

// state is every key of the space's layers and lane: the lane, the IP
// window, the caller's bucket.
func (sp space) state(t *testing.T, c *redis.Client, lane, ip, caller string) [3]keyState {
	t.Helper()
	ctx := context.Background()
	var out [3]keyState
	for i, k := range []string{sp.lanes.Key(bucket.Key{Lane: lane}), sp.prefix + ":{callers}:ipw:" + ip, sp.prefix + ":{callers}:c:" + caller} {
		v, err := c.Get(ctx, k).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		exp, err := c.Do(ctx, "PEXPIRETIME", k).Int64()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = keyState{v, exp}
	}
	return out
}

// sameState: the same values, and expiries that differ by no more than the
// real time between the two writes (the TTLs written are equal: both
// scripts ran on the same injected now).
func sameState(a, b [3]keyState) bool {
	for i := range a {
		if a[i].v != b[i].v || (a[i].exp < 0) != (b[i].exp < 0) || max(a[i].exp-b[i].exp, b[i].exp-a[i].exp) > 2000 {
			return false
		}
	}
	return true
}

// TestFoldedMatchesSeparate: on one injected clock, the folded script (the
// layers and the lane's peek in one run) answers exactly what the separate
// calls answer (the layers' script, then redisbucket's Peek) and leaves
// exactly the same state, step by step: admissions, refusals by each
// layer, an observed IP layer, a peek (cost 0), a lane with and without
// room, a plan change.
func TestFoldedMatchesSeparate(t *testing.T) {
	rs := testenv.StartRedis(t)
	c := client(t, rs.URL())
	ctx := context.Background()
	mc := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	sep, fold := newSpace(c, mc, false), newSpace(c, mc, true)
	laneLim := bucket.Limit{Rate: 2, Burst: 3}
	plan := bucket.Limit{Rate: 10.0 / 60, Burst: 4}
	base := quota.Request{IP: "203.0.113.9", PerIP: quota.Window{Limit: 6, Length: time.Minute}, Caller: "key:k", Plan: plan, Cost: 1,
		Lane: bucket.Key{Lane: "l"}, LaneLimit: laneLim}
	type step struct {
		advance time.Duration
		reserve int // lane slots the drain takes first
		mod     func(r *quota.Request)
	}
	steps := []step{
		{}, {}, {reserve: 3}, {}, // plan allows 4, the lane empties
		{advance: 100 * time.Millisecond}, // plan refuses (over its burst), the IP layer counts
		{mod: func(r *quota.Request) { r.Cost = 0 }},
		{advance: 6 * time.Second}, {reserve: 1},
		{}, {}, {}, // the IP layer refuses: 6 in the window
		{mod: func(r *quota.Request) { r.ObserveIP = true }},                              // observed: the plan decides
		{advance: 30 * time.Second, mod: func(r *quota.Request) { r.Cost = 2 }},           // half the window slid
		{mod: func(r *quota.Request) { r.Plan = bucket.Limit{Rate: 1.0 / 60, Burst: 2} }}, // a stricter plan clamps
		{advance: time.Minute, mod: func(r *quota.Request) { r.IP = "" }},
		{mod: func(r *quota.Request) { r.Caller = "" }},
		{advance: 2 * time.Second},
	}
	for i, s := range steps {
		mc.Advance(s.advance)
		if s.reserve > 0 {
			for _, sp := range []space{sep, fold} {
				if _, err := sp.lanes.Reserve(ctx, bucket.Key{Lane: "l"}, laneLim, s.reserve); err != nil {
					t.Fatal(err)
				}
			}
		}
		r := base
		if s.mod != nil {
			s.mod(&r)
		}
		want, err := sep.quotas.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if want.LaneChecked {
			t.Fatalf("step %d: the store without Lanes folded the lane", i)
		}
		want.LaneChecked = true
		if want.Lane, err = sep.lanes.Peek(ctx, r.Lane, laneLim); err != nil {
			t.Fatal(err)
		}
		got, err := fold.quotas.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("step %d (%+v):\nfolded   %+v\nseparate %+v", i, r, got, want)
		}
		if a, b := sep.state(t, c, "l", "203.0.113.9", "key:k"), fold.state(t, c, "l", "203.0.113.9", "key:k"); !sameState(a, b) {
			t.Fatalf("step %d: state after the separate calls %v, after the folded one %v", i, a, b)
		}
	}
}

// TestFoldedRefusalTouchesNothingElse: a refusal by one layer leaves the
// other layers' state and the lane's as they were (value and TTL): the
// per-IP layer's refusal takes no token and does not touch the lane, the
// plan's refusal does not touch the lane, and a lane with no room (which
// queues, never refuses) changes nothing of the layers' answers.
func TestFoldedRefusalTouchesNothingElse(t *testing.T) {
	ctx := context.Background()
	laneLim := bucket.Limit{Rate: 1, Burst: 1}
	mc := clock.NewManual(foldStart)
	c, sp := reservedLane(t, mc, laneLim, 5)
	r := layered(laneLim)
	check := func() quota.Result {
		t.Helper()
		res, err := sp.quotas.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if !res.LaneChecked || res.Lane.Allowed || res.Lane.RetryAfter <= 0 {
			t.Fatalf("lane: %+v, want no room", res)
		}
		return res
	}
	state := func() [3]keyState { return sp.state(t, c, "l", "198.51.100.7", "key:a") }
	lane := state()[0]
	// The lane has no room: both layers still admit, and write.
	for range 2 {
		if res := check(); !res.IP.Allowed || !res.Plan.Allowed {
			t.Fatalf("%+v, want both layers to admit", res)
		}
	}
	// The plan refuses: the IP window counts the request (it got past the
	// per-IP layer), the caller's bucket and the lane stay as they were.
	before := state()
	if res := check(); !res.IP.Allowed || res.Plan.Allowed {
		t.Fatalf("%+v, want the plan to refuse", res)
	}
	after := state()
	if after[0] != before[0] || after[2] != before[2] || after[1] == before[1] {
		t.Fatalf("plan refusal: before %v, after %v; want only the IP window changed", before, after)
	}
	// Two seconds on, the plan has its burst again but the window is full
	// (3 of 3): the IP layer refuses, the plan is not asked and loses no
	// token, the lane is untouched.
	mc.Advance(2 * time.Second)
	before = state()
	res := check()
	if res.IP.Allowed || res.PlanChecked {
		t.Fatalf("%+v, want the IP layer to refuse without asking the plan", res)
	}
	if after := state(); after != before {
		t.Fatalf("IP refusal: before %v, after %v; want nothing changed", before, after)
	}
	if r.IP = ""; !check().Plan.Allowed {
		t.Fatal("the plan lost a token to the IP layer's refusal")
	}
	if got := state()[0]; got != lane {
		t.Fatalf("the lane's state went from %v to %v; the layers must never write it", lane, got)
	}
}

// TestFoldedThreeInstances: three instances (each its own client, lane
// store and quota store) share one Redis on Redis TIME and check one
// caller concurrently with its lane folded in: the per-IP window and the
// plan hold exactly across them, and every check read the lane.
func TestFoldedThreeInstances(t *testing.T) {
	rs := testenv.StartRedis(t)
	p := "f" + strconv.FormatInt(prefixes.Add(1), 10)
	laneLim := bucket.Limit{Rate: 100, Burst: 5}
	r := quota.Request{IP: "192.0.2.44", PerIP: quota.Window{Limit: 20, Length: time.Hour}, Caller: "key:fleet",
		Plan: bucket.Limit{Rate: 1.0 / 3600, Burst: 12}, Cost: 1, Lane: bucket.Key{Lane: "shared"}, LaneLimit: laneLim}
	var ipAllowed, planAllowed, planChecked, laneChecked atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		c := client(t, rs.URL())
		lanes := redisbucket.New(c, redisbucket.Config{Prefix: p})
		s := redisquota.New(c, redisquota.Config{Prefix: p, Lanes: lanes})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				res, err := s.Check(context.Background(), r)
				if err != nil {
					t.Error(err)
					return
				}
				if res.IP.Allowed {
					ipAllowed.Add(1)
				}
				if res.PlanChecked {
					planChecked.Add(1)
				}
				if res.Plan.Allowed {
					planAllowed.Add(1)
				}
				if res.LaneChecked && res.Lane.Allowed {
					laneChecked.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ipAllowed.Load() != 20 || planChecked.Load() != 20 || planAllowed.Load() != 12 || laneChecked.Load() != 30 {
		t.Fatalf("IP allowed %d (want 20), plan checked %d (want 20) and allowed %d (want 12), lane read with room %d (want 30)",
			ipAllowed.Load(), planChecked.Load(), planAllowed.Load(), laneChecked.Load())
	}
}

// TestFoldedOnRedisTime: on Redis TIME, the lane's state read in the
// folded script agrees with a Peek of its own made right after (the next
// free slot, within the time between the two calls), and the layers'
// counts are the separate script's.
func TestFoldedOnRedisTime(t *testing.T) {
	ctx := context.Background()
	laneLim := bucket.Limit{Rate: 1, Burst: 1}
	_, sp := reservedLane(t, nil, laneLim, 30)
	r := quota.Request{IP: "192.0.2.8", PerIP: quota.Window{Limit: 1000, Length: time.Hour}, Caller: "key:t",
		Plan: bucket.Limit{Rate: 1.0 / 3600, Burst: 3}, Cost: 1, Lane: bucket.Key{Lane: "l"}, LaneLimit: laneLim}
	for i := range 5 {
		start := time.Now()
		res, err := sp.quotas.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		p, err := sp.lanes.Peek(ctx, r.Lane, laneLim)
		if err != nil {
			t.Fatal(err)
		}
		between := time.Since(start)
		if !res.LaneChecked || res.Lane.Allowed || p.Allowed || res.Lane.RetryAfter < p.RetryAfter || res.Lane.RetryAfter-p.RetryAfter > between {
			t.Fatalf("check %d: folded %+v, separate %+v, %v apart", i, res.Lane, p, between)
		}
		if res.IP.Count != float64(i) || res.Plan.Allowed != (i < 3) {
			t.Fatalf("check %d: %+v, want %d counted before it and the plan to allow %v", i, res, i, i < 3)
		}
	}
}

// TestFoldedRestoresLostLane: the folded peek keeps redisbucket's floor: a
// lane state Redis lost (FLUSHALL) comes back as an empty bucket, not a
// fresh burst, exactly as a Peek of its own would restore it.
func TestFoldedRestoresLostLane(t *testing.T) {
	ctx := context.Background()
	laneLim := bucket.Limit{Rate: 1, Burst: 2}
	c, sp := reservedLane(t, nil, laneLim, 10)
	r := quota.Request{Lane: bucket.Key{Lane: "l"}, LaneLimit: laneLim}
	res, err := sp.quotas.Check(ctx, r)
	if err != nil || !res.LaneChecked || res.Lane.Allowed {
		t.Fatalf("%+v %v, want the lane read with no room", res, err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err = sp.quotas.Check(ctx, r)
	if err != nil || !res.LaneChecked || res.Lane.Allowed || res.Lane.RetryAfter < 7*time.Second || sp.lanes.Restored() != 1 {
		t.Fatalf("after FLUSHALL: %+v %v, restored %d; want no room for about 9s, restored once", res, err, sp.lanes.Restored())
	}
}

// TestFoldedUnreadableLaneKeepsTheLayers: when the folded script ran (the
// layers charged) but the lane's part of its answer cannot be read, Check
// still answers the layers, with LaneChecked false so that admission peeks
// the lane on its own; an error would have quota.Failover charge its
// fallback limiter for the same request. A lane state far beyond what a
// time.Duration holds (Lua reads it, the store does not) makes the lane's
// answer unreadable.
func TestFoldedUnreadableLaneKeepsTheLayers(t *testing.T) {
	ctx := context.Background()
	laneLim := bucket.Limit{Rate: 1, Burst: 1}
	c, sp := reservedLane(t, clock.NewManual(foldStart), laneLim, 0)
	if err := c.Set(ctx, sp.lanes.Key(bucket.Key{Lane: "l"}), "9000000000000000.000", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r := layered(laneLim)
	before := sp.state(t, c, "l", "198.51.100.7", "key:a")
	res, err := sp.quotas.Check(ctx, r)
	if err != nil {
		t.Fatalf("check: %v, want the layers' answer", err)
	}
	if res.LaneChecked || !res.IP.Allowed || !res.Plan.Allowed || !res.PlanChecked {
		t.Fatalf("%+v, want both layers to admit and the lane unchecked", res)
	}
	after := sp.state(t, c, "l", "198.51.100.7", "key:a")
	if after[1] == before[1] || after[2] == before[2] {
		t.Fatalf("before %v, after %v: want both layers charged by the one run", before, after)
	}
}
