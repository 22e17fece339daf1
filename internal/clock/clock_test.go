package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestManual(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := clock.NewManual(t0)
	c.Advance(time.Second)
	if err := c.Sleep(context.Background(), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Sleep(context.Background(), -time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.Now().Sub(t0); got != 3*time.Second {
		t.Fatalf("clock moved %v, want 3s", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Sleep(ctx, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a cancelled context = %v", err)
	}
}

// The real clock is checked against the wall clock with an honest
// tolerance: a sleep is never short, and a cancel ends it at once.
func TestRealSleep(t *testing.T) {
	start := time.Now()
	if err := clock.Real.Sleep(context.Background(), 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("Sleep(20ms) returned after %v", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	start = time.Now()
	if err := clock.Real.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Sleep = %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("cancelled Sleep returned after %v", took)
	}
	if err := clock.Real.Sleep(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRealSleep: a wait on the real clock, as the drain makes one per
// slot. It allocates nothing: timers are reused.
func BenchmarkRealSleep(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if err := clock.Real.Sleep(ctx, time.Microsecond); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRealSleepReusesNoStaleTimer: a wait cut short by its context leaves
// its timer to the next wait, which must still last its whole duration
// (a stale expiry of the first timer must not end it early).
func TestRealSleepReusesNoStaleTimer(t *testing.T) {
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := clock.Real.Sleep(ctx, time.Millisecond); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Sleep returned %v", err)
		}
		time.Sleep(2 * time.Millisecond) // the first timer's time passes
		start := time.Now()
		if err := clock.Real.Sleep(context.Background(), 5*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 5*time.Millisecond {
			t.Fatalf("Sleep(5ms) returned after %v: a stale timer ended it", took)
		}
	}
}
