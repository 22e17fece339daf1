package leaky_test

import (
	"context"
	"errors"
	"testing"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/leaky"
)

// heldPacer wraps a Pacer and counts the slots it handed out.
type heldPacer struct {
	leaky.Pacer
	reserved int
	check    func(n int)
}

func (p *heldPacer) Reserve(ctx context.Context, n int) (bucket.Reservation, error) {
	p.check(n)
	r, err := p.Pacer.Reserve(ctx, n)
	if err == nil {
		p.reserved += r.N
	}
	return r, err
}

// TestMaxHeldBoundsTheSlotsInHand: whenever a drain reserves, the slots it
// already holds unstarted plus the ones it asks for stay within
// MaxHeld(Batch). A fleet restoring a lost lane state counts on that bound
// for the other instances (redisbucket.Config.Held).
func TestMaxHeldBoundsTheSlotsInHand(t *testing.T) {
	for _, tc := range []struct {
		rate        float64
		maxInflight int
	}{{20, 16}, {1_000, 64}, {10_000, 1024}, {100_000, 1024}} {
		l := bucket.Limit{Rate: tc.rate, Burst: 5}
		batch := leaky.BatchFor(l.Rate, tc.maxInflight)
		clock := buckettest.NewClock()
		ctx, cancel := context.WithCancel(context.Background())
		src := &sliceSource{items: items(3000), cancel: cancel}
		started := 0
		var d *leaky.Drain[item]
		worst := 0
		p := &heldPacer{Pacer: leaky.StorePacer{Store: &bucket.Memory{Clock: clock}, Key: bucket.Key{Lane: "l"}, Limit: func() bucket.Limit { return l }}}
		p.check = func(n int) {
			held := p.reserved - started - int(d.Missed())
			worst = max(worst, held+n)
		}
		var err error
		d, err = leaky.New(leaky.Config[item]{
			Source:      src,
			Pacer:       p,
			Start:       func(_ context.Context, _ item, done func()) { started++; done() },
			MaxInflight: tc.maxInflight,
			Batch:       batch,
			Clock:       clock,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Run(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
		cancel()
		if worst > leaky.MaxHeld(batch) {
			t.Errorf("rate %v, batch %d: held %d slots at once, MaxHeld says %d", tc.rate, batch, worst, leaky.MaxHeld(batch))
		}
		t.Logf("rate %v, batch %d: at most %d slots in hand (MaxHeld %d)", tc.rate, batch, worst, leaky.MaxHeld(batch))
	}
}
