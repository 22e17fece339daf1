package bucket

import (
	"context"
	"sync"

	"github.com/throttler/throttler/internal/clock"
	"time"
)

// Memory is the in-process Store for a single instance. Its zero value is
// ready to use with the system clock; it is safe for concurrent use. States
// whose bucket is full again are dropped on a periodic sweep, so memory stays
// bounded by the number of busy keys.
//
// Memory must not be shared by several throttler instances behind one queue:
// each would grant the full rate and the lane would run N times too fast.
type Memory struct {
	// Clock is the time source (only Now is used); nil means clock.Real.
	// Set it before first use.
	Clock clock.Clock

	mu     sync.Mutex
	states map[Key]time.Time
	ops    int // operations since the last sweep
}

var _ Store = (*Memory)(nil)

// sweepEvery is how many operations pass between sweeps of idle states.
const sweepEvery = 4096

func (m *Memory) now() time.Time {
	if m.Clock == nil {
		return clock.Real.Now()
	}
	return m.Clock.Now()
}

// update runs f on k's state under the lock and stores the result.
func (m *Memory) update(k Key, f func(now, tat time.Time) time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.states == nil {
		m.states = make(map[Key]time.Time)
	}
	now := m.now()
	m.states[k] = f(now, m.states[k])
	m.ops++
	if m.ops == sweepEvery {
		m.ops = 0
		for key, tat := range m.states {
			if IdleAfter(now, tat) == 0 {
				delete(m.states, key)
			}
		}
	}
}

// Admit implements Store.
func (m *Memory) Admit(_ context.Context, k Key, l Limit) (Decision, error) {
	if err := l.Validate(); err != nil {
		return Decision{}, err
	}
	var d Decision
	m.update(k, func(now, tat time.Time) time.Time {
		var next time.Time
		d, next = Admit(now, tat, l)
		return next
	})
	return d, nil
}

// Reserve implements Store.
func (m *Memory) Reserve(_ context.Context, k Key, l Limit, n int) (Reservation, error) {
	if err := l.Validate(); err != nil {
		return Reservation{}, err
	}
	var r Reservation
	m.update(k, func(now, tat time.Time) time.Time {
		var next time.Time
		r, next = Reserve(now, tat, l, n)
		return next
	})
	return r, nil
}

// Peek implements Store.
func (m *Memory) Peek(_ context.Context, k Key, l Limit) (Decision, error) {
	if err := l.Validate(); err != nil {
		return Decision{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return Peek(m.now(), m.states[k], l), nil
}

// Pause implements Store.
func (m *Memory) Pause(_ context.Context, k Key, l Limit, d time.Duration) error {
	if err := l.Validate(); err != nil {
		return err
	}
	m.update(k, func(now, tat time.Time) time.Time {
		return Pause(tat, now.Add(d), l)
	})
	return nil
}
