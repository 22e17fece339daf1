package leaky_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/leaky"
)

// countingObserver counts the drain's reservations and starts.
type countingObserver struct{ reserved, started atomic.Int64 }

func (o *countingObserver) Started(time.Duration) { o.started.Add(1) }
func (o *countingObserver) Reserved(n int)        { o.reserved.Add(int64(n)) }
func (o *countingObserver) PacerDown(bool, error) {}

// TestDrainHeldReservesAndStartsNothing: while Held returns a channel the
// drain reserves no slot and starts no item, although it holds items;
// once the channel closes every item starts, in order. Absence is checked
// on the counters at a known moment: when the drain has asked Held again
// after it began waiting on the hold.
func TestDrainHeldReservesAndStartsNothing(t *testing.T) {
	clock := buckettest.NewClock()
	ctx, cancel := virtualCtx(t)
	defer cancel()
	src := &sliceSource{items: items(5), cancel: cancel}
	l := bucket.Limit{Rate: 10, Burst: 2}
	release := make(chan struct{})
	var mu sync.Mutex
	holding := true
	asked := make(chan struct{}, 16)
	obs := &countingObserver{}
	var starts []int
	d, err := leaky.New(leaky.Config[item]{
		Source: src, MaxInflight: 4, Batch: 4, Clock: clock, Observer: obs,
		Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clock}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }},
		Held: func() <-chan struct{} {
			mu.Lock()
			defer mu.Unlock()
			select {
			case asked <- struct{}{}:
			default:
			}
			if holding {
				return release
			}
			return nil
		},
		Start: func(_ context.Context, it item, done func()) {
			starts = append(starts, it.n)
			done()
			src.started()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	// Held is asked once items are in hand; the drain then waits on it.
	<-asked
	// Virtual time passes: nothing may wake the drain but the release.
	clock.Advance(10 * time.Second)
	if n, s := obs.reserved.Load(), obs.started.Load(); n != 0 || s != 0 {
		t.Fatalf("while held: %d slots reserved, %d items started; want 0 and 0", n, s)
	}
	mu.Lock()
	holding = false
	close(release)
	mu.Unlock()
	<-ran
	if len(starts) != 5 {
		t.Fatalf("after the release %d items started, want 5", len(starts))
	}
	for i, n := range starts {
		if n != i {
			t.Fatalf("start %d is item %d: order broken", i, n)
		}
	}
}
