package quota

import (
	"sync"
	"time"
)

// Usage sums what callers used over the last minute, per name (a plan, a
// lane), in one-second slots, and counts the distinct callers of each name
// over the same minute. Safe for concurrent use; the time is an argument.
type Usage struct {
	mu    sync.Mutex
	names map[string]*usageRing
}

// usageWindow is the span Usage sums over.
const usageWindow = 60

// maxCallersPerName bounds the callers remembered per name: past it, new
// callers count as one (the figure then overstates utilization).
const maxCallersPerName = 100_000

type usageRing struct {
	secs    [usageWindow]int64
	used    [usageWindow]float64
	callers map[string]int64 // caller → the second it was last seen
}

// Add records n tokens used by caller (may be "") under name at now.
func (u *Usage) Add(name, caller string, n float64, now time.Time) {
	sec := now.Unix()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.names == nil {
		u.names = map[string]*usageRing{}
	}
	r := u.names[name]
	if r == nil {
		r = &usageRing{callers: map[string]int64{}}
		u.names[name] = r
	}
	i := sec % usageWindow
	if r.secs[i] != sec {
		r.secs[i], r.used[i] = sec, 0
	}
	r.used[i] += n
	if caller == "" {
		return
	}
	if _, ok := r.callers[caller]; !ok && len(r.callers) >= maxCallersPerName {
		r.sweep(sec)
		if len(r.callers) >= maxCallersPerName {
			caller = "…"
		}
	}
	r.callers[caller] = sec
}

func (r *usageRing) sweep(sec int64) {
	for c, s := range r.callers {
		if s <= sec-usageWindow {
			delete(r.callers, c)
		}
	}
}

// Used returns the tokens used under name over the last minute before
// now, and the distinct callers seen in it.
func (u *Usage) Used(name string, now time.Time) (used float64, callers int) {
	sec := now.Unix()
	u.mu.Lock()
	defer u.mu.Unlock()
	r := u.names[name]
	if r == nil {
		return 0, 0
	}
	for i := range r.secs {
		if s := r.secs[i]; s > sec-usageWindow && s <= sec {
			used += r.used[i]
		}
	}
	r.sweep(sec)
	return used, len(r.callers)
}

// Utilization is used divided by what rate (tokens per second) allows
// each of callers over the last minute; 0 without callers.
func Utilization(used float64, callers int, rate float64) float64 {
	if callers == 0 || rate <= 0 {
		return 0
	}
	return used / (rate * usageWindow * float64(callers))
}
