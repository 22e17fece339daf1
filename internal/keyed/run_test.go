package keyed_test

import (
	"context"
	"slices"
	"sync"
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
