package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/admission"
)

// aheadPublisher is fakePublisher with a fixed count of jobs ahead.
type aheadPublisher struct {
	*fakePublisher
	ahead int64
}

func (p aheadPublisher) Ahead(context.Context, string, string, uint64, time.Duration) (int64, error) {
	return p.ahead, nil
}

// TestKeyedETAReadsStartedTwice: a keyed job's ETA reads the key's started
// jobs once before and once after refreshing the key's state, and subtracts
// the count it read from the jobs ahead; it does not read it a third time.
func TestKeyedETAReadsStartedTwice(t *testing.T) {
	f := newFixture(t, nil)
	f.h.cfg.Publisher = aheadPublisher{fakePublisher: f.pub, ahead: 3}
	calls := 0
	lane := Lane{KeyStarted: func(context.Context, string) (int, error) {
		calls++
		return 1, nil
	}}
	dec := admission.Decision{Step: time.Second}
	got := f.h.eta(context.Background(), dec, lane, "demo", "k", 9)
	if want := dec.ETA(2); got != want {
		t.Fatalf("eta %v, want %v (3 ahead less 1 started)", got, want)
	}
	if calls != 2 {
		t.Fatalf("KeyStarted read %d times, want 2", calls)
	}
}
