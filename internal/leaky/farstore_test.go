package leaky_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/leaky"
)

// farPacer is a pacer whose store is far away: each call takes a leg of
// 0.5 to 1.5 ms (random, on the real clock) to reach the store and another
// to come back, as a network's queueing makes legs differ from call to call.
type farPacer struct {
	p   leaky.StorePacer
	mu  sync.Mutex
	rng *rand.Rand
}

func (f *farPacer) leg() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return 500*time.Microsecond + time.Duration(f.rng.Int64N(int64(time.Millisecond)))
}

func (f *farPacer) Reserve(ctx context.Context, n int) (bucket.Reservation, error) {
	time.Sleep(f.leg())
	r, err := f.p.Reserve(ctx, n)
	time.Sleep(f.leg())
	return r, err
}

func (f *farPacer) Current() bucket.Limit { return f.p.Current() }

// TestFarStoreKeepsWholePeriodWindows: three drains share one lane at
// 1,000/s burst 1 through a store whose answers take 1 to 3 ms, each leg
// different (farPacer; the in-memory store on the real clock). Every window
// of whole periods (up to 200) beginning at a start holds at most burst + m
// starts, on the start times. Before the drain placed its slots on the
// store's clock (Reservation.At), each reservation's slots started one
// return leg late, the legs differing, and windows of 19 periods held 23 to
// 28 starts where 20 are allowed. The
// rate is internal/fleet's concern (TestRemoteRedisKeepsG1Exact); here
// only that the drains kept going.
func TestFarStoreKeepsWholePeriodWindows(t *testing.T) {
	realClock(t)
	l := bucket.Limit{Rate: 1000, Burst: 1}
	const n = 2000
	store := &bucket.Memory{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var left atomic.Int64
	left.Store(n)
	src := &sharedSource{left: &left}
	var mu sync.Mutex
	starts := make([]time.Duration, 0, n)
	t0 := time.Now()
	drains := make([]*leaky.Drain[item], 3)
	for i := range drains {
		var err error
		drains[i], err = leaky.New(leaky.Config[item]{
			Source:      src,
			Pacer:       &farPacer{p: leaky.StorePacer{Store: store, Key: bucket.Key{Lane: "far"}, Limit: func() bucket.Limit { return l }}, rng: rand.New(rand.NewPCG(uint64(i), 7))},
			MaxInflight: 64,
			Batch:       leaky.BatchFor(l.Rate, 64),
			Start: func(_ context.Context, _ item, done func()) {
				at := time.Since(t0)
				mu.Lock()
				starts = append(starts, at)
				if len(starts) == n {
					cancel()
				}
				mu.Unlock()
				done()
			},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for _, d := range drains {
		wg.Go(func() { _ = d.Run(ctx) })
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != n {
		t.Fatalf("%d of %d jobs started within 30 s", len(starts), n)
	}
	var missed uint64
	for _, d := range drains {
		missed += d.Missed()
	}
	slices.Sort(starts)
	ex, got, allowed := maxInWholeWindows(starts, l, 200)
	t.Logf("%d jobs in %v, %d slots given up; busiest window of whole periods: %d starts where G1 allows %d",
		n, (starts[n-1] - starts[0]).Round(time.Millisecond), missed, got, allowed)
	if ex > 0 {
		t.Errorf("G1 broken: %d starts in a window of %d periods where %v allows %d", got, allowed-l.Burst, l, allowed)
	}
}

// sharedSource is a backlog several drains take from: left jobs, handed
// out up to max at a time, given back on Release.
type sharedSource struct{ left *atomic.Int64 }

func (s *sharedSource) Next(ctx context.Context, max int) ([]item, error) {
	for {
		left := s.left.Load()
		if left <= 0 {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		take := min(left, int64(max))
		if s.left.CompareAndSwap(left, left-take) {
			return make([]item, take), nil
		}
	}
}

func (s *sharedSource) Release(items []item) { s.left.Add(int64(len(items))) }
