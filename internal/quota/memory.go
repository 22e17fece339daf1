package quota

import (
	"context"
	"sync"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
)

// Memory is the Limiter of a single instance, and the fallback of a fleet
// while Redis is away. Its zero value is ready with the system clock; it
// is safe for concurrent use. Idle states are dropped on a periodic sweep,
// so memory stays bounded by the callers active within a window. It never
// reads a lane (Request.Lane): Result.LaneChecked stays false.
type Memory struct {
	// Clock is the time source (only Now); nil means clock.Real. Set it
	// before first use.
	Clock clock.Clock

	mu      sync.Mutex
	windows map[string]windowState
	tats    map[string]time.Time
	ops     int
}

var _ Limiter = (*Memory)(nil)

type windowState struct {
	index     int64
	cur, prev int64
	length    time.Duration
}

const memorySweepEvery = 4096

// Check implements Limiter.
func (m *Memory) Check(_ context.Context, r Request) (Result, error) {
	if err := r.Validate(); err != nil {
		return Result{}, err
	}
	c := m.Clock
	if c == nil {
		c = clock.Real
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := c.Now()
	if m.windows == nil {
		m.windows, m.tats = map[string]windowState{}, map[string]time.Time{}
	}
	var res Result
	ipOK := true
	if r.IP != "" && r.PerIP.On() {
		idx, elapsed := windowIndex(now, r.PerIP.Length)
		st := m.windows[r.IP]
		var cur, prev int64
		switch {
		case st.length != r.PerIP.Length:
			// A new window length starts afresh.
		case st.index == idx:
			cur, prev = st.cur, st.prev
		case st.index == idx-1:
			prev = st.cur
		}
		res.IPChecked = true
		res.IP = Slide(elapsed, prev, cur, r.PerIP, 1)
		ipOK = res.IP.Allowed
		if ipOK {
			m.windows[r.IP] = windowState{index: idx, cur: cur + 1, prev: prev, length: r.PerIP.Length}
		}
	}
	if r.Caller != "" && (ipOK || r.ObserveIP) {
		var next time.Time
		res.PlanChecked = true
		tat, clamped := clampTAT(now, m.tats[r.Caller], r.Plan)
		res.Plan, next = bucket.AdmitN(now, tat, r.Plan, r.Cost)
		switch {
		case res.Plan.Allowed && r.Cost > 0:
			m.tats[r.Caller] = next
		case clamped:
			m.tats[r.Caller] = tat
		}
	}
	m.ops++
	if m.ops%memorySweepEvery == 0 {
		m.sweep(now)
	}
	return res, nil
}

// sweep drops states equal to fresh ones: windows two lengths old, and
// buckets full again.
func (m *Memory) sweep(now time.Time) {
	for k, st := range m.windows {
		if idx, _ := windowIndex(now, st.length); st.index < idx-1 {
			delete(m.windows, k)
		}
	}
	for k, tat := range m.tats {
		if !tat.After(now) {
			delete(m.tats, k)
		}
	}
}
