package keyed_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/keyed"
)

// recClaims is keyed.Local that records the keys released.
type recClaims struct {
	keyed.Local
	fail     bool // every release fails
	mu       sync.Mutex
	released []string
}

func (c *recClaims) Release(ctx context.Context, _, key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, key)
	if c.fail {
		return errDown
	}
	return ctx.Err()
}

func (c *recClaims) releasedKeys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.released)
}

// TestPacerRun: on the real clock, Run claims the keys with stored jobs
// (its first sweep) and the ones announced later, starts every job in its
// key's order, releases a key with nothing left, and at the stop answers
// the waiting workers and waits for the dispatches in flight.
func TestPacerRun(t *testing.T) {
	r := &memReader{}
	r.add("a", "a1")
	r.add("a", "a2")
	claims := &recClaims{}
	workers := &memWorkers{}
	var mu sync.Mutex
	var started []string
	inflight := make(chan func(), 10)
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: &bucket.Memory{Clock: clock.Real}, Claims: claims, Workers: workers,
		Start: func(_ context.Context, j *memJob, done func()) {
			mu.Lock()
			started = append(started, j.id)
			mu.Unlock()
			r.remove(j.id)
			inflight <- done
		},
		LaneLimit: func() bucket.Limit { return bucket.Limit{Rate: 1000, Burst: 1} },
		KeyLimit:  func(string) bucket.Limit { return bucket.Limit{Rate: 1000, Burst: 1} },
		KeyOpts:   twoEach, MaxInflight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	startedNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(started)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { k.Run(ctx, context.WithoutCancel(ctx)); close(ran) }()
	settleAll := func() {
		for {
			select {
			case done := <-inflight:
				done()
			default:
				return
			}
		}
	}
	eventually(t, 5*time.Second, "a's jobs start", func() bool { settleAll(); return len(startedNow()) == 2 })
	r.add("b", "b1")
	k.Announce("b")
	eventually(t, 5*time.Second, "b's job starts", func() bool { settleAll(); return len(startedNow()) == 3 })
	if s := startedNow(); !slices.Equal(s, []string{"a1", "a2", "b1"}) {
		t.Fatalf("started %v", s)
	}
	eventually(t, 5*time.Second, "the idle keys released", func() bool {
		settleAll()
		rel := claims.releasedKeys()
		return slices.Contains(rel, "a") && slices.Contains(rel, "b")
	})
	// One job in flight at the stop: Run waits for it.
	r.add("c", "c1")
	k.Announce("c")
	eventually(t, 5*time.Second, "c's job starts", func() bool { return len(startedNow()) == 4 })
	cancel()
	select {
	case <-ran:
		t.Fatal("Run returned with a dispatch in flight")
	case <-time.After(50 * time.Millisecond):
	}
	(<-inflight)()
	<-ran
	if workers.stops.Load() != 1 {
		t.Fatalf("waiting workers answered %d times at the stop, want 1", workers.stops.Load())
	}
	if used := workers.claims.Load() - workers.unclaims.Load(); used != 4 {
		t.Fatalf("workers' claims used %d, want 4 (one per job)", used)
	}
}

// TestPacerRestsWithNoJob: with no key to choose, the loop rests (until a
// key's slot, at most bounceAfter on a pull-mode lane) instead of asking
// again at once: on the real clock, a few steps in 300 ms, not thousands.
func TestPacerRestsWithNoJob(t *testing.T) {
	workers := &memWorkers{}
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: &memReader{}, Pair: nopPair{}, Claims: keyed.Local{}, Workers: workers,
		Start: func(_ context.Context, _ *memJob, done func()) { done() }, LaneLimit: laneLimit, KeyLimit: keyLimit,
		KeyOpts: oneEach, MaxInflight: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { k.Run(ctx, ctx); close(ran) }()
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-ran
	// 300 ms / 95 ms ≈ 4 steps; a loaded machine makes fewer, never more.
	if n := workers.claims.Load(); n < 1 || n > 10 {
		t.Fatalf("%d steps in 300 ms with no job, want about 4", n)
	}
	if workers.claims.Load() != workers.unclaims.Load() {
		t.Fatalf("claims %d, unclaims %d: a step with no job gives its worker back", workers.claims.Load(), workers.unclaims.Load())
	}
}

// eventually polls cond every millisecond until it holds, or fails the test
// after d (testenv.Eventually, without the test environment's servers in
// the mutation run's test binary).
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentSteps: as many steps run at once as lane slots fit in the
// lookahead, from one (a lane whose period is the lookahead or more: every
// step chooses at the lane's next slot) up to the bound.
func TestConcurrentSteps(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		want int
	}{
		{1, 1},
		{10, 1},
		{199, 1},
		{200, 1}, // a period of 5 ms: the lookahead
		{400, 2},
		{1000, 5},
		{5000, 25},
		{6400, 32},
		{100_000, 32},
		{bucket.MaxRate, 32},
	} {
		if got := keyed.ConcurrentSteps(bucket.Limit{Rate: tc.rate, Burst: 1}); got != tc.want {
			t.Errorf("rate %v: %d steps at once, want %d", tc.rate, got, tc.want)
		}
	}
}

// overlapReader is memReader whose reads wait (up to a second) until
// another read is under way: a loop that reads one key at a time fails
// its test, one that overlaps its steps passes.
type overlapReader struct {
	*memReader
	mu       sync.Mutex
	in, most int
	cond     *sync.Cond
}

func (r *overlapReader) Next(ctx context.Context, key string, from uint64) (*memJob, bool, error) {
	r.mu.Lock()
	r.in++
	r.most = max(r.most, r.in)
	r.cond.Broadcast()
	deadline := time.Now().Add(time.Second)
	timer := time.AfterFunc(time.Second, func() { r.mu.Lock(); r.cond.Broadcast(); r.mu.Unlock() })
	for r.in < 2 && time.Now().Before(deadline) && r.most < 2 {
		r.cond.Wait()
	}
	timer.Stop()
	r.in--
	r.mu.Unlock()
	return r.memReader.Next(ctx, key, from)
}

func (r *overlapReader) maxIn() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most
}

// TestPacerOverlapsKeys: on the real clock, an uncapped lane reads and
// reserves several keys at once (their round trips overlap), and every
// key's jobs still start in its order, each once.
func TestPacerOverlapsKeys(t *testing.T) {
	const keys, each = 40, 3
	r := &overlapReader{memReader: &memReader{}}
	r.cond = sync.NewCond(&r.mu)
	for j := range each {
		for i := range keys {
			r.add(fmt.Sprintf("k%02d", i), fmt.Sprintf("k%02d-%d", i, j))
		}
	}
	var mu sync.Mutex
	started := map[string][]string{}
	total := 0
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: &bucket.Memory{Clock: clock.Real}, Claims: keyed.Local{},
		Start: func(_ context.Context, j *memJob, done func()) {
			mu.Lock()
			started[j.key] = append(started[j.key], j.id)
			total++
			mu.Unlock()
			r.remove(j.id)
			done()
		},
		LaneLimit: func() bucket.Limit { return bucket.Limit{Rate: bucket.MaxRate, Burst: 1} },
		KeyLimit:  func(string) bucket.Limit { return bucket.Limit{Rate: 1000, Burst: 1} },
		KeyOpts:   oneEach, MaxInflight: 16,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A job whose slot was missed (woken late) goes back, as the queue
	// tells the pacer.
	r.memReader.mu.Lock()
	r.memReader.onRequeue = k.Requeue
	r.memReader.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { k.Run(ctx, ctx); close(ran) }()
	eventually(t, 20*time.Second, "every job started", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total == keys*each
	})
	cancel()
	<-ran
	if n := r.maxIn(); n < 2 {
		t.Fatalf("at most %d reads under way at once, want several", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range keys {
		key := fmt.Sprintf("k%02d", i)
		want := []string{key + "-0", key + "-1", key + "-2"}
		if !slices.Equal(started[key], want) {
			t.Fatalf("key %s started %v, want %v (its order, each once)", key, started[key], want)
		}
	}
}

// countingDown is a pair store that is down, counting the reservations
// asked of it.
type countingDown struct{ calls atomic.Int64 }

func (p *countingDown) ReservePair(context.Context, bucket.Key, bucket.Limit, bucket.Limit, time.Duration, time.Duration) (bucket.PairReservation, error) {
	p.calls.Add(1)
	return bucket.PairReservation{}, errDown
}

// TestPacerDownRestsOverlappingSteps: with its steps overlapping (an
// uncapped lane) and the pacer down, a failed reservation rests the whole
// loop for retryWait, not only its key: 200 keys with jobs are not all
// tried at once, only those whose steps were under way.
func TestPacerDownRestsOverlappingSteps(t *testing.T) {
	r := &memReader{}
	for i := range 200 {
		r.add(fmt.Sprintf("k%03d", i), fmt.Sprintf("j%03d", i))
	}
	pair := &countingDown{}
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: pair, Claims: keyed.Local{},
		Start:     func(_ context.Context, _ *memJob, done func()) { done() },
		LaneLimit: func() bucket.Limit { return bucket.Limit{Rate: bucket.MaxRate, Burst: 1} },
		KeyLimit:  func(string) bucket.Limit { return bucket.Limit{Rate: 1000, Burst: 1} },
		KeyOpts:   oneEach, MaxInflight: 64,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { k.Run(ctx, ctx); close(ran) }()
	eventually(t, 10*time.Second, "a reservation asked", func() bool { return pair.calls.Load() > 0 })
	// The first failure rests the loop 100 ms: at most the 32 steps under
	// way by then ask, then as many at the retry.
	start := time.Now()
	for time.Since(start) < 150*time.Millisecond {
		if n := pair.calls.Load(); n >= 150 {
			t.Fatalf("%d reservations asked of a pacer that is down within %v, want the loop to rest", n, time.Since(start))
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-ran
}

// TestPacerReadsWhileLeasing: with Leases, a step's read of the key's next
// job and its acquire of the key's leases are under way at once (two
// round trips to two stores).
func TestPacerReadsWhileLeasing(t *testing.T) {
	leasing := make(chan struct{})
	var once sync.Once
	r := &gatedReader{memReader: &memReader{}, gate: leasing}
	r.add("a", "a1")
	leases := &memLeases{onTake: func(string) { once.Do(func() { close(leasing) }) }}
	var started atomic.Int64
	k, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: r, Pair: &bucket.Memory{Clock: clock.Real}, Claims: keyed.Local{}, Leases: leases, Instance: "a",
		Start:     func(_ context.Context, _ *memJob, done func()) { started.Add(1); done() },
		LaneLimit: laneLimit, KeyLimit: keyLimit, KeyOpts: oneEach, MaxInflight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { k.Run(ctx, ctx); close(ran) }()
	eventually(t, 10*time.Second, "a1 started", func() bool { return started.Load() == 1 })
	cancel()
	<-ran
	if r.waitedOut.Load() {
		t.Fatal("the read waited a second for the acquire: they did not overlap")
	}
}

// gatedReader is memReader whose reads wait (up to a second) for gate to
// close.
type gatedReader struct {
	*memReader
	gate      chan struct{}
	waitedOut atomic.Bool
}

func (r *gatedReader) Next(ctx context.Context, key string, from uint64) (*memJob, bool, error) {
	select {
	case <-r.gate:
	case <-time.After(time.Second):
		r.waitedOut.Store(true)
	}
	return r.memReader.Next(ctx, key, from)
}

// TestStepSlots: at most n steps run at once; a step that ends frees its
// slot for the next.
func TestStepSlots(t *testing.T) {
	take, finish := keyed.StepSlots(2)
	ctx := context.Background()
	done, cancel := context.WithCancel(ctx)
	cancel()
	steps := []struct {
		take bool // else finish
		ctx  context.Context
		want bool
	}{
		{true, ctx, true},
		{true, ctx, true},
		{true, done, false}, // both slots taken: waits until ctx ends
		{false, nil, false},
		{true, ctx, true},
		{true, done, false},
		{false, nil, false},
		{false, nil, false},
		{true, ctx, true},
		{true, ctx, true},
		{true, done, false},
	}
	for i, s := range steps {
		if !s.take {
			finish()
			continue
		}
		if got := take(s.ctx); got != s.want {
			t.Fatalf("step %d: took a slot %v, want %v", i, got, s.want)
		}
	}
}
