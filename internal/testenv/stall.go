package testenv

import (
	"sync"
	"testing"
	"time"
)

// StallMeter measures how late this test process gets to run: a goroutine
// that sleeps 5 ms at a time records the worst oversleep. When the process
// is held off the CPU (a loaded machine, a GC pause), work in it waits too
// and then comes together: arrivals at a target in the test process come
// closer than their starts, a clump the throttler did not make. Tests that
// judge arrival times widen their jitter by a multiple of WorstStall, and
// say so.
type StallMeter struct {
	mu    sync.Mutex
	worst time.Duration
}

// StartStallMeter measures until tb ends, then logs the worst stall.
func StartStallMeter(tb testing.TB) *StallMeter {
	m := &StallMeter{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			before := time.Now()
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			late := time.Since(before) - 5*time.Millisecond
			m.mu.Lock()
			m.worst = max(m.worst, late)
			m.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		close(stop)
		<-done
		tb.Logf("worst stall of the test process while the test ran: %v", m.WorstStall().Round(time.Millisecond))
	})
	return m
}

// WorstStall is the longest stall seen so far.
func (m *StallMeter) WorstStall() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.worst
}
