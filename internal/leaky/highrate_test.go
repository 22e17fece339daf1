package leaky_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/leaky"
)

// chanSource hands out a fixed number of items as fast as the drain takes
// them, then blocks until the run ends, like a queue with a deep backlog.
type chanSource struct {
	mu   sync.Mutex
	left int
	next int
}

func (s *chanSource) Next(ctx context.Context, max int) ([]item, error) {
	s.mu.Lock()
	n := min(max, s.left)
	out := make([]item, n)
	for i := range out {
		out[i] = item{n: s.next}
		s.next++
	}
	s.left -= n
	s.mu.Unlock()
	if n == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return out, nil
}

func (s *chanSource) Release(items []item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left += len(items)
}

// runRealClock drains n items at l on the real clock with the in-memory
// store and returns the start times, relative to the first, and the slots
// the drain missed.
func runRealClock(t *testing.T, l bucket.Limit, maxInflight, n int) ([]time.Duration, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := make([]time.Time, 0, n)
	d, err := leaky.New(leaky.Config[item]{
		Source:      &chanSource{left: n},
		Pacer:       leaky.StorePacer{Store: &bucket.Memory{}, Key: bucket.Key{Lane: "fast"}, Limit: func() bucket.Limit { return l }},
		MaxInflight: maxInflight,
		Batch:       leaky.BatchFor(l.Rate, maxInflight),
		Start: func(_ context.Context, _ item, done func()) {
			// Only the drain's goroutine calls Start.
			at = append(at, time.Now())
			if len(at) == n {
				cancel()
			}
			done()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Run(ctx)
	if len(at) != n {
		t.Fatalf("%d of %d started before the 30 s bound", len(at), n)
	}
	rel := make([]time.Duration, n)
	for i := range at {
		rel[i] = at[i].Sub(at[0])
	}
	return rel, d.Missed()
}

// TestRealClockTenThousandPerSecond: one lane at 10,000 jobs/s, burst 10,
// on the real clock. The period (100 µs) is far shorter than a Go timer
// sleeps in an idle process (about 1 ms); the real clock's wait ends in the
// kernel (clock.Real), a few tens of µs late, so the drain wakes about once
// per slot, and a late wake-up starts the slots within their tolerance (τ =
// 0.9 ms) at once. The achieved rate must be within 3 % of the limit, and
// no window may hold more than burst + rate·W starts with W widened by one
// period (a start is less than that after its slot's theoretical time, so
// windows of whole periods are exact) and a millisecond for the time between
// the drain's check and the Start callback reading the clock.
//
// The rate is a capability (the pacer is not what holds a lane back), and a
// loaded machine that takes the CPU away for milliseconds takes those slots
// with it (given up, never caught up in a clump): so the best of three runs
// counts, and on a machine that stalls, the slots it gave up (counted by
// Missed) may make up the rest of the rate, down to 80 % achieved. G1 must
// hold in every run.
func TestRealClockTenThousandPerSecond(t *testing.T) {
	realClock(t)
	l := bucket.Limit{Rate: 10_000, Burst: 10}
	const n = 20_000
	// At 10,000 jobs/s a lane needs max_inflight ≥ rate × dispatch time, in
	// the hundreds for any real target; with 256 a batch is 200 slots (20 ms,
	// BatchFor), one store call per 200 jobs. The drain's wake-up after the
	// last slot of a batch costs capacity only beyond τ + T (1 ms here), so
	// tiny batches (max_inflight 16: 1.6 ms) lose a few % to timer lateness.
	const maxInflight = 256
	// best is the best run's rate; paced, the same run's rate counting the
	// slots it gave up (each one a wake-up past its deadline: the
	// machine's stall, counted, never a clump).
	best, paced := 0.0, 0.0
	for run := 1; run <= 3 && best < 0.97*l.Rate && !(raceEnabled && run > 1); run++ {
		at, missed := runRealClock(t, l, maxInflight, n)
		span := at[n-1]
		rate := float64(n-l.Burst) / span.Seconds()
		if rate > best {
			paced = float64(n-l.Burst+int(missed)) / span.Seconds()
		}
		t.Logf("run %d: %d jobs in %v: %.0f jobs/s (limit %v, max_inflight %d), %d slots missed", run, n, span.Round(time.Millisecond), rate, l, maxInflight, missed)
		if rate > 1.001*l.Rate {
			t.Fatalf("achieved %.0f jobs/s, over the limit %v", rate, l.Rate)
		}
		// Windows up to 200 ms (2,000 starts) keep the check fast; the rate
		// check covers the whole run.
		checkWindowsUpTo(t, at, l, 200*time.Millisecond, l.Period()+time.Millisecond)
		best = max(best, rate)
	}
	switch {
	case raceEnabled:
		// The race detector's instrumentation, not the pacer, bounds the
		// rate here; G1 was still checked on every run. make test checks it.
		t.Logf("race detector on: rate %.0f jobs/s reported, not checked", best)
	case best >= 0.97*l.Rate:
	case paced >= 0.97*l.Rate && best >= 0.80*l.Rate:
		// A loaded machine (this one has 2 cores shared by many) took
		// the CPU away for more than τ at times: the drain kept
		// pace with its slots and gave up, and counted, the ones it woke
		// too late for (up to 12 % seen here at load average 18). Beyond 20 %
		// lost it is the drain, not the machine.
		t.Logf("best of three runs %.0f jobs/s; %.0f jobs/s counting the slots missed to stalls", best, paced)
	default:
		t.Errorf("best of three runs %.0f jobs/s (%.0f counting the slots missed), want %v within 3%% (or within 20%% with the missed slots making up the rest)", best, paced, l.Rate)
	}
}

// checkWindowsUpTo is buckettest.CheckWindows for long runs: it checks every
// window that begins at a start and is at most maxW long.
func checkWindowsUpTo(t *testing.T, at []time.Duration, l bucket.Limit, maxW, tol time.Duration) {
	t.Helper()
	for i := range at {
		for j := i; j < len(at) && at[j]-at[i] <= maxW; j++ {
			w := at[j] - at[i] + tol
			if allowed := float64(l.Burst) + l.Rate*w.Seconds(); float64(j-i+1) > allowed+1e-9 {
				t.Fatalf("G1 broken: %d starts in window [%v, %v] (W=%v), limit %v allows %.2f", j-i+1, at[i], at[j], w, l, allowed)
			}
		}
	}
}

// stallClock is a manual clock with one stall: the sleep that ends after stallAt
// wakes stall late, as a process paused by GC or the scheduler does.
type stallClock struct {
	*clock.Manual
	stallAt, stall time.Duration
	t0             time.Time
	stalled        bool
}

func (c *stallClock) Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		c.Advance(d)
		if !c.stalled && c.Now().Sub(c.t0) >= c.stallAt {
			c.stalled = true
			c.Advance(c.stall)
		}
	}
	return ctx.Err()
}

// runStalled drains n jobs at l on clock (a stallClock: one stall on the
// way) into a Start that notes each start's time after clock's t0, and
// checks that every job started once, in order. It returns the start
// times and the drain (for its Missed count).
func runStalled(t *testing.T, l bucket.Limit, clock *stallClock, n int) ([]time.Duration, *leaky.Drain[item]) {
	t.Helper()
	clock.t0 = clock.Now()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	src := &sliceSource{items: items(n), cancel: cancel}
	var starts []time.Duration
	var order []int
	d, err := leaky.New(leaky.Config[item]{
		Source:      src,
		Pacer:       leaky.StorePacer{Store: &bucket.Memory{Clock: clock}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		MaxInflight: 64,
		Batch:       leaky.BatchFor(l.Rate, 64),
		Clock:       clock,
		Start: func(_ context.Context, it item, done func()) {
			starts = append(starts, clock.Now().Sub(clock.t0))
			order = append(order, it.n)
			done()
			src.started()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Run(ctx)
	if len(starts) != n {
		t.Fatalf("%d starts, want %d", len(starts), n)
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("start %d is job %d: order broken", i, got)
		}
	}
	return starts, d
}

// TestStallDoesNotClump: a drain at 1,000 jobs/s, burst 1, stalls for 20 ms
// in the middle of a batch. Without a deadline the 20 slots that passed
// would start at once; with it the missed ones are given up (lost capacity)
// and no start is a period or more after its slot, so every window holds at
// most burst + rate·W starts, checked exactly on the start times. Every job
// still starts once, in order.
func TestStallDoesNotClump(t *testing.T) {
	l := bucket.Limit{Rate: 1000, Burst: 1}
	clock := &stallClock{Manual: buckettest.NewClock(), stallAt: 50 * time.Millisecond, stall: 20 * time.Millisecond}
	starts, d := runStalled(t, l, clock, 200)
	// The stall costs the time it swallowed: the reserved slots it passed
	// are missed, the rest were never reserved.
	if d.Missed() == 0 {
		t.Error("no slot missed across a 20 ms stall")
	}
	if end, lo, hi := starts[len(starts)-1], 199*time.Millisecond+clock.stall-leaky.DefaultMaxLate, 199*time.Millisecond+clock.stall+l.Period(); end < lo || end > hi {
		t.Errorf("last start at %v, want in [%v, %v]", end, lo, hi)
	}
	t.Logf("missed %d slots; starts around the stall: %v", d.Missed(), starts[45:55])
	buckettest.CheckWindows(t, starts, l, 0)
	// Without the bound, the 20 ms stall would put 21 starts in one instant.
	for i := range starts {
		j := i
		for j < len(starts) && starts[j] == starts[i] {
			j++
		}
		if j-i > 3 {
			t.Fatalf("%d starts at %v: a clump", j-i, starts[i])
		}
	}
}

// TestPartialFetchesShareOneCall: a queue that hands out three jobs at a
// time (as a JetStream pull often does) must not cost one store call per
// fetch: a call reserves a whole batch and the next fetches use the rest.
func TestPartialFetchesShareOneCall(t *testing.T) {
	l := bucket.Limit{Rate: 1000, Burst: 1}
	clock := buckettest.NewClock()
	t0 := clock.Now()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	src := &trickleSource{sliceSource: sliceSource{items: items(600), cancel: cancel}, per: 3}
	calls := 0
	var starts []time.Duration
	store := &bucket.Memory{Clock: clock}
	d, err := leaky.New(leaky.Config[item]{
		Source: src, Clock: clock, MaxInflight: 64, Batch: leaky.BatchFor(l.Rate, 64), // 20
		Pacer: pacerFunc{limit: l, reserve: func(ctx context.Context, n int) (bucket.Reservation, error) {
			calls++
			return store.Reserve(ctx, bucket.Key{Lane: "l"}, l, n)
		}},
		Start: func(_ context.Context, _ item, done func()) {
			starts = append(starts, clock.Now().Sub(t0))
			done()
			src.started()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Run(ctx)
	if len(starts) != 600 {
		t.Fatalf("%d starts, want 600", len(starts))
	}
	// A call tops the slots held up to the batch (20): about 19 each. One
	// call per fetch would be 200.
	if calls > 600/15 {
		t.Fatalf("%d store calls for 600 jobs fetched 3 at a time, want about one per 20", calls)
	}
	t.Logf("%d store calls for 600 jobs fetched 3 at a time", calls)
	if want := 599 * l.Period(); starts[599] != want {
		t.Fatalf("last start at %v, want %v: no time lost between batches", starts[599], want)
	}
	buckettest.CheckWindows(t, starts, l, 0)
}

// trickleSource is a sliceSource that hands out at most per items a call.
type trickleSource struct {
	sliceSource
	per int
}

func (s *trickleSource) Next(ctx context.Context, max int) ([]item, error) {
	return s.sliceSource.Next(ctx, min(max, s.per))
}

// pacerFunc is a leaky.Pacer made of a function and a fixed limit.
type pacerFunc struct {
	limit   bucket.Limit
	reserve func(ctx context.Context, n int) (bucket.Reservation, error)
}

func (f pacerFunc) Reserve(ctx context.Context, n int) (bucket.Reservation, error) {
	return f.reserve(ctx, n)
}

func (f pacerFunc) Current() bucket.Limit { return f.limit }
