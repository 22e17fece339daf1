package dispatch

import (
	"fmt"
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	one := func() float64 { return 1.0 }
	half := func() float64 { return 0.5 }
	zero := func() float64 { return 0 }
	steps := []struct {
		name    string
		b       Backoff
		attempt int
		rnd     func() float64
		want    time.Duration
	}{
		{"first attempt full", b, 1, one, 100 * time.Millisecond},
		{"second attempt full", b, 2, one, 200 * time.Millisecond},
		{"third attempt full", b, 3, one, 400 * time.Millisecond},
		{"fourth attempt full", b, 4, one, 800 * time.Millisecond},
		{"fifth attempt capped", b, 5, one, time.Second},
		{"huge attempt capped", b, 1000, one, time.Second},
		{"first attempt half", b, 1, half, 50 * time.Millisecond},
		{"third attempt half", b, 3, half, 200 * time.Millisecond},
		{"capped half", b, 9, half, 500 * time.Millisecond},
		{"zero jitter", b, 3, zero, 0},
		{"attempt 0 counts as 1", b, 0, one, 100 * time.Millisecond},
		{"negative attempt counts as 1", b, -5, one, 100 * time.Millisecond},
		{"rnd above 1 clamped", b, 2, func() float64 { return 7 }, 200 * time.Millisecond},
		{"rnd below 0 clamped", b, 2, func() float64 { return -1 }, 0},
		{"zero value", Backoff{}, 3, one, 0},
		{"base above max", Backoff{Base: 5 * time.Second, Max: time.Second}, 1, one, time.Second},
		{"no max: no overflow", Backoff{Base: time.Second}, 200, one, time.Duration(1<<63 - 1)},
		{"no max: doubles", Backoff{Base: time.Second}, 4, half, 4 * time.Second},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if got := s.b.Delay(s.attempt, s.rnd); got != s.want {
				t.Errorf("Delay(%d) = %v, want %v", s.attempt, got, s.want)
			}
		})
	}
}

func TestBackoffDelayDefaultRandInRange(t *testing.T) {
	b := Backoff{Base: time.Second, Max: 5 * time.Minute}
	for attempt := 1; attempt <= 20; attempt++ {
		ceil := min(b.Max, b.Base<<(attempt-1))
		for range 50 {
			if d := b.Delay(attempt, nil); d < 0 || d > ceil {
				t.Fatalf("Delay(%d) = %v, outside [0, %v]", attempt, d, ceil)
			}
		}
	}
}

func ExampleBackoff_Delay() {
	b := Backoff{Base: time.Second, Max: 10 * time.Second}
	full := func() float64 { return 1 }
	for attempt := 1; attempt <= 5; attempt++ {
		fmt.Println(attempt, b.Delay(attempt, full))
	}
	// Output:
	// 1 1s
	// 2 2s
	// 3 4s
	// 4 8s
	// 5 10s
}
