package leaky_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/leaky"
)

func TestBatchFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate        float64
		maxInflight int
		want        int
	}{
		{1, 16, 1},          // 0.02 slots: at least one
		{20, 16, 1},         // 0.4
		{50, 16, 1},         // exactly one
		{100, 256, 2},       // 20 ms of slots
		{1_000, 256, 20},    //
		{1_000, 10, 10},     // at most max_inflight
		{1_000, 20, 20},     // max_inflight exactly
		{25_600, 1024, 512}, // exactly the cap
		{100_000, 1024, 512},
	} {
		if got := leaky.BatchFor(tc.rate, tc.maxInflight); got != tc.want {
			t.Errorf("BatchFor(%v, %d) = %d, want %d", tc.rate, tc.maxInflight, got, tc.want)
		}
	}
}

// countingPacer records the size of every Reserve call and when it came.
type countingPacer struct {
	mu    sync.Mutex
	p     leaky.Pacer
	clock clock.Clock
	fail  bool
	sizes []int
	last  time.Time
	limit int // calls after which the run is cut short (a spinning drain)
	stop  context.CancelFunc
}

func (c *countingPacer) Reserve(ctx context.Context, n int) (bucket.Reservation, error) {
	c.mu.Lock()
	c.sizes = append(c.sizes, n)
	c.last = c.clock.Now()
	if len(c.sizes) >= c.limit {
		c.stop()
	}
	c.mu.Unlock()
	if c.fail {
		return bucket.Reservation{}, bucket.ErrUnavailable
	}
	return c.p.Reserve(ctx, n)
}

func (c *countingPacer) Current() bucket.Limit { return c.p.Current() }

// TestBatchBoundsEachReserve: a drain reserves Config.Batch slots per call,
// at least 1 and at most MaxInflight.
func TestBatchBoundsEachReserve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ batch, maxInflight, want int }{
		{0, 4, 1}, {1, 4, 1}, {3, 4, 3}, {4, 4, 4}, {8, 4, 4},
	} {
		clk := buckettest.NewClock()
		ctx, cancel := virtualCtx(t)
		l := bucket.Limit{Rate: 100, Burst: 1}
		pacer := &countingPacer{clock: clk, limit: 1000, stop: cancel,
			p: leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }}}
		src := &sliceSource{items: items(24), cancel: cancel}
		d, err := leaky.New(leaky.Config[item]{
			Source: src, Pacer: pacer, Clock: clk,
			MaxInflight: tc.maxInflight, Batch: tc.batch,
			Start: func(_ context.Context, _ item, done func()) { done(); src.started() },
		})
		if err != nil {
			t.Fatal(err)
		}
		d.Run(ctx)
		cancel()
		if len(pacer.sizes) == 0 {
			t.Fatalf("Batch %d: no Reserve call", tc.batch)
		}
		for _, n := range pacer.sizes {
			if n != tc.want {
				t.Fatalf("Batch %d, MaxInflight %d: Reserve sizes %v, want each %d", tc.batch, tc.maxInflight, pacer.sizes, tc.want)
			}
		}
	}
}

// TestPacerDownTiming: while the pacer fails, the drain calls it every
// RetryBackoff (default 100 ms) and hands its jobs back after GiveBackAfter
// (default 5 s), in virtual time.
func TestPacerDownTiming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		backoff, giveBack time.Duration
		calls             int
		last              time.Duration
	}{
		{0, 0, 51, 5 * time.Second}, // the defaults: 0, 0.1 s, … 5 s
		{250 * time.Millisecond, time.Second, 5, time.Second},
	} {
		clk := buckettest.NewClock()
		t0 := clk.Now()
		ctx, cancel := virtualCtx(t)
		src := &sliceSource{items: items(2), cancel: cancel}
		// A drain that does not wait between calls would call forever on
		// a virtual clock: cut it short.
		pacer := &countingPacer{clock: clk, fail: true, limit: 1000, stop: cancel,
			p: leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return bucket.Limit{Rate: 1, Burst: 1} }}}
		d, _ := leaky.New(leaky.Config[item]{
			Source: src, Pacer: pacer, Clock: clk, MaxInflight: 2, Batch: 2,
			RetryBackoff: tc.backoff, GiveBackAfter: tc.giveBack,
			Start: func(_ context.Context, _ item, done func()) { done() },
		})
		if err := d.Run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
		cancel()
		if len(pacer.sizes) != tc.calls || pacer.last.Sub(t0) != tc.last || len(src.released) != 2 {
			t.Errorf("backoff %v, give back after %v: %d calls, the last at %v, %d given back; want %d, %v, 2",
				tc.backoff, tc.giveBack, len(pacer.sizes), pacer.last.Sub(t0), len(src.released), tc.calls, tc.last)
		}
	}
}

// TestMaxLateBound: at 1,000 jobs/s (1 ms apart), burst 1, a slot may start
// less than one period after its time: a 0.5 ms stall costs nothing, a
// 1.5 ms stall costs the slot it overslept (its job takes the next one, due
// half a period before the wake-up), and a 3 ms stall the three slots that
// passed by a period or more. A MaxLate of 0.3 ms narrows the bound below
// the 0.5 ms stall; one of 2 ms cannot widen it past the period.
func TestMaxLateBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxLate, stall time.Duration
		missed         uint64
	}{
		{0, 500 * time.Microsecond, 0},
		{0, 1500 * time.Microsecond, 1},
		{300 * time.Microsecond, 500 * time.Microsecond, 1},
		{leaky.DefaultMaxLate, 1500 * time.Microsecond, 1},
		{0, 3 * time.Millisecond, 3},
	} {
		clk := &stallClock{Manual: buckettest.NewClock(), stallAt: 10 * time.Millisecond, stall: tc.stall}
		clk.t0 = clk.Now()
		ctx, cancel := virtualCtx(t)
		l := bucket.Limit{Rate: 1000, Burst: 1}
		started := 0
		src := &sliceSource{items: items(40), cancel: cancel}
		d, _ := leaky.New(leaky.Config[item]{
			Source: src, Clock: clk, MaxInflight: 64,
			Batch:   leaky.BatchFor(l.Rate, 64),
			MaxLate: tc.maxLate,
			Pacer:   leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
			Start:   func(_ context.Context, _ item, done func()) { started++; done(); src.started() },
		})
		d.Run(ctx)
		cancel()
		if started != 40 || d.Missed() != tc.missed {
			t.Errorf("MaxLate %v, stall %v: %d started, %d slots missed; want 40 started, %d missed", tc.maxLate, tc.stall, started, d.Missed(), tc.missed)
		}
	}
}

// TestReservedAheadIsBounded: the drain tops its slots up before they run
// out, but not further: when a backlog ends, at most a batch and a half of
// reserved slots go unused (lost capacity the lane's state still counts).
func TestReservedAheadIsBounded(t *testing.T) {
	t.Parallel()
	clk := buckettest.NewClock()
	ctx, cancel := virtualCtx(t)
	l := bucket.Limit{Rate: 1000, Burst: 1}
	store := &bucket.Memory{Clock: clk}
	key := bucket.Key{Lane: "l"}
	const batch = 20
	d, _ := leaky.New(leaky.Config[item]{
		Source: &partialSource{left: 200, chunk: 3, cancel: cancel}, Clock: clk, MaxInflight: 64, Batch: batch,
		Pacer: leaky.StorePacer{Store: store, Key: key, Limit: func() bucket.Limit { return l }},
		Start: func(_ context.Context, _ item, done func()) { done() },
	})
	d.Run(ctx)
	cancel()
	p, err := store.Peek(context.Background(), key, l)
	if err != nil {
		t.Fatal(err)
	}
	if unused := int(p.RetryAfter / l.Period()); unused > batch*3/2 {
		t.Fatalf("%d slots reserved and unused after the backlog ended, want at most %d (1.5 batches)", unused, batch*3/2)
	}
}

// partialSource hands out left items chunk at a time, then cancels.
type partialSource struct {
	left, chunk, next int
	cancel            context.CancelFunc
}

func (s *partialSource) Next(ctx context.Context, max int) ([]item, error) {
	n := min(max, s.chunk, s.left)
	if n == 0 {
		s.cancel()
		return nil, ctx.Err()
	}
	out := make([]item, n)
	for i := range out {
		out[i] = item{n: s.next}
		s.next++
	}
	s.left -= n
	return out, nil
}

func (s *partialSource) Release([]item) {}

// TestAIMDEdges: a zero Interval never steps (and never divides by it); a
// peer's factor equal to ours changes nothing, nor postpones the recovery.
func TestAIMDEdges(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &leaky.AIMD{Decrease: 0.5, Increase: 0.1, Min: 0.1}
	a.Factor(t0)
	a.Limited(t0)
	if f := a.Factor(t0.Add(time.Hour)); f != 0.5 {
		t.Fatalf("zero Interval: factor %v an hour later, want 0.5 (no steps)", f)
	}
	b := &leaky.AIMD{Decrease: 0.5, Increase: 0.1, Min: 0.1, Interval: time.Second}
	b.Limited(t0)
	if changed := b.Adopt(0.5, t0.Add(900*time.Millisecond)); changed {
		t.Fatal("adopting our own factor reported a change")
	}
	if f := b.Factor(t0.Add(time.Second)); f != 0.6 {
		t.Fatalf("factor %v one interval after the decrease, want 0.6: an equal adoption postponed the step", f)
	}
}

// frozenClock never reaches a future time: Sleep waits for ctx.
type frozenClock struct{ *clock.Manual }

func (frozenClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestStopGivesBackHeldItems: items the drain holds when its run ends
// (fetched, waiting for their slots) go back to the Source, every one.
func TestStopGivesBackHeldItems(t *testing.T) {
	t.Parallel()
	clk := frozenClock{buckettest.NewClock()}
	ctx, cancel := virtualCtx(t)
	src := &blockingSource{ch: make(chan item, 8)}
	for _, it := range items(8) {
		src.ch <- it
	}
	l := bucket.Limit{Rate: 1, Burst: 1}
	var started []int
	d, _ := leaky.New(leaky.Config[item]{
		Source: src, Clock: clk, MaxInflight: 8, Batch: 8,
		Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		Start: func(_ context.Context, it item, done func()) {
			started = append(started, it.n)
			done()
			cancel() // stop while the others wait for their slots
		},
	})
	if err := d.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	if len(started) != 1 || len(src.ch) != 7 {
		t.Fatalf("started %v, %d back in the source; want 1 started and the 7 others back", started, len(src.ch))
	}
}

// flakySource answers its first calls with an error or with nothing at
// all, then hands out its items.
type flakySource struct {
	sliceSource
	script []error // one entry per early call: an error, or nil for an empty batch
	calls  int
}

func (s *flakySource) Next(ctx context.Context, max int) ([]item, error) {
	if s.calls < len(s.script) {
		err := s.script[s.calls]
		s.calls++
		return nil, err
	}
	return s.sliceSource.Next(ctx, max)
}

// TestFetchTroubleIsRetried: a fetch that fails is retried after
// RetryBackoff, an empty one at once; every item still starts, in order.
func TestFetchTroubleIsRetried(t *testing.T) {
	t.Parallel()
	clk := buckettest.NewClock()
	t0 := clk.Now()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	boom := errors.New("jetstream away")
	src := &flakySource{sliceSource: sliceSource{items: items(3), cancel: cancel}, script: []error{boom, nil, boom, nil}}
	l := bucket.Limit{Rate: 1000, Burst: 10}
	var order []int
	d, _ := leaky.New(leaky.Config[item]{
		Source: src, Clock: clk, MaxInflight: 4, Batch: 4, RetryBackoff: 300 * time.Millisecond,
		Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		Start: func(_ context.Context, it item, done func()) { order = append(order, it.n); done(); src.started() },
	})
	d.Run(ctx)
	if len(order) != 3 || order[0] != 0 || order[2] != 2 {
		t.Fatalf("started %v, want [0 1 2]", order)
	}
	if waited := clk.Now().Sub(t0); waited != 600*time.Millisecond {
		t.Fatalf("waited %v for two failed fetches and two empty ones, want 2 × 300ms", waited)
	}
}

// TestNewChecksConfig: New refuses a Config without a Source, Pacer or
// Starter, or without room for one dispatch, and names what is missing.
func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	clk := buckettest.NewClock()
	good := func() leaky.Config[item] {
		return leaky.Config[item]{
			Source: &sliceSource{}, MaxInflight: 1, Clock: clk,
			Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"},
				Limit: func() bucket.Limit { return bucket.Limit{Rate: 1, Burst: 1} }},
			Start: func(_ context.Context, _ item, done func()) { done() },
		}
	}
	if _, err := leaky.New(good()); err != nil {
		t.Fatalf("New(a good config with MaxInflight 1) = %v", err)
	}
	for _, tc := range []struct {
		want string
		mod  func(*leaky.Config[item])
	}{
		{"Source", func(c *leaky.Config[item]) { c.Source = nil }},
		{"Pacer", func(c *leaky.Config[item]) { c.Pacer = nil }},
		{"Start", func(c *leaky.Config[item]) { c.Start = nil }},
		{"MaxInflight 0", func(c *leaky.Config[item]) { c.MaxInflight = 0 }},
	} {
		cfg := good()
		tc.mod(&cfg)
		if d, err := leaky.New(cfg); err == nil || d != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New without %s = %v, %v; want an error naming it", tc.want, d, err)
		}
	}
}

// TestMaxHeld: the bound on slots held reserved and unstarted is two
// batches and a half (a batch in hand, under a batch and a half left over,
// a batch more reserved), and a drain keeps it.
func TestMaxHeld(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ batch, want int }{{0, 2}, {1, 2}, {2, 5}, {7, 17}, {20, 50}} {
		if got := leaky.MaxHeld(tc.batch); got != tc.want {
			t.Errorf("MaxHeld(%d) = %d, want %d", tc.batch, got, tc.want)
		}
	}
	clk := buckettest.NewClock()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	const batch = 20
	l := bucket.Limit{Rate: 1000, Burst: 1}
	obs := &heldObserver{}
	var d *leaky.Drain[item]
	obs.missed = func() uint64 { return d.Missed() }
	d, _ = leaky.New(leaky.Config[item]{
		Source: &patternSource{left: 2000, chunks: []int{3, 3, 3, 20, 1, 20, 7, 20}, cancel: cancel}, Clock: clk, MaxInflight: 64, Batch: batch,
		Pacer:    leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		Start:    func(_ context.Context, _ item, done func()) { done() },
		Observer: obs,
	})
	d.Run(ctx)
	// Small chunks leave slots over; a full batch then comes while nearly a
	// batch and a half is held, and a batch more is reserved: the pattern
	// reaches 49, one short of the bound.
	if obs.max > leaky.MaxHeld(batch) || obs.max < leaky.MaxHeld(batch)-2 {
		t.Fatalf("the drain held at most %d slots reserved and unstarted, want at most MaxHeld(%d) = %d and near it (the chunks reach it)", obs.max, batch, leaky.MaxHeld(batch))
	}
}

// heldObserver tracks the slots reserved and not yet started or missed;
// the drain calls it from its one goroutine.
type heldObserver struct {
	reserved, started int
	max               int
	missed            func() uint64
}

func (o *heldObserver) Started(time.Duration) { o.started++ }
func (o *heldObserver) Reserved(n int) {
	o.reserved += n
	o.max = max(o.max, o.reserved-o.started-int(o.missed()))
}
func (o *heldObserver) PacerDown(bool, error) {}

// patternSource hands out left items in chunks of the sizes in chunks, in
// turn (capped by the drain's max), then cancels.
type patternSource struct {
	left, next int
	chunks     []int
	cancel     context.CancelFunc
}

func (s *patternSource) Next(ctx context.Context, max int) ([]item, error) {
	n := min(max, s.chunks[s.next%len(s.chunks)], s.left)
	if n == 0 {
		s.cancel()
		return nil, ctx.Err()
	}
	s.next++
	s.left -= n
	return make([]item, n), nil
}

func (s *patternSource) Release([]item) {}

// TestPanicIsNotAHang: a panic in the drain's goroutine (here the Starter's)
// leaves Run at once, with the permits of the items it held still taken,
// rather than waiting for them forever: a crash must not become a hang.
func TestPanicIsNotAHang(t *testing.T) {
	t.Parallel()
	clk := buckettest.NewClock()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	d, err := leaky.New(leaky.Config[item]{
		Source: &sliceSource{items: items(4), cancel: cancel}, Clock: clk, MaxInflight: 4, Batch: 4,
		Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"},
			Limit: func() bucket.Limit { return bucket.Limit{Rate: 1, Burst: 4} }},
		Start: func(context.Context, item, func()) { panic("boom") },
	})
	if err != nil {
		t.Fatal(err)
	}
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		_ = d.Run(ctx)
	}()
	select {
	case p := <-recovered:
		if p != "boom" {
			t.Fatalf("Run ended with %v, want the Starter's panic", p)
		}
	case <-time.After(10 * time.Second): // only on failure
		t.Fatal("Run hung after a panic in its goroutine")
	}
}

// TestTopUpAtHalfABatch: a drain handed one item at a time reserves its next
// batch when the slots it holds are fewer than the item plus half a batch
// (here at 10 left of 20), not sooner (slots held longer) nor later (the
// next item might wait for a store call).
func TestTopUpAtHalfABatch(t *testing.T) {
	t.Parallel()
	clk := buckettest.NewClock()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	l := bucket.Limit{Rate: 1000, Burst: 1}
	obs := &topUpObserver{}
	d, _ := leaky.New(leaky.Config[item]{
		Source: &patternSource{left: 60, chunks: []int{1}, cancel: cancel}, Clock: clk, MaxInflight: 64, Batch: 20,
		Pacer:    leaky.StorePacer{Store: &bucket.Memory{Clock: clk}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		Start:    func(_ context.Context, _ item, done func()) { done() },
		Observer: obs,
	})
	d.Run(ctx)
	if want := []int{0, 10, 30, 50}; !slices.Equal(obs.startedAt, want) || d.Missed() != 0 {
		t.Fatalf("reserved after %v starts (missed %d), want after %v", obs.startedAt, d.Missed(), want)
	}
}

// topUpObserver records how many items had started at each Reserve.
type topUpObserver struct {
	started   int
	startedAt []int
}

func (o *topUpObserver) Started(time.Duration) { o.started++ }
func (o *topUpObserver) Reserved(int)          { o.startedAt = append(o.startedAt, o.started) }
func (o *topUpObserver) PacerDown(bool, error) {}
