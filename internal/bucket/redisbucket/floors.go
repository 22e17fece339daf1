package redisbucket

import (
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// floors remembers, per Redis key, the latest tat a Store has seen while it
// is ahead of now: the floor sent with every call so that a script can tell
// a lost state from an expired one (see "Lost state" in lua.go). The zero
// value is ready; it is safe for concurrent use. Entries whose tat has
// passed are dropped on a periodic sweep, so memory stays bounded by the
// number of busy keys.
type floors struct {
	mu       sync.Mutex
	m        map[string]floor
	ops      int // raises since the last sweep
	restored atomic.Uint64
}

type floor struct {
	tat   int64     // ns since the Unix epoch, on the scripts' clock
	state string    // tat in the state format, as the script wrote it
	until time.Time // local time after which tat has surely passed
}

// floorSlack keeps a floor for a while after its tat should have passed by
// the local clock, for the difference between the local clock and Redis
// TIME. A floor sent after it passed does nothing.
const floorSlack = time.Second

// sweepEvery is how many raises pass between sweeps of passed floors.
const sweepEvery = 4096

// get returns key's floor in the state format, or "" when there is none.
func (f *floors) get(key string) string {
	f.mu.Lock()
	e, ok := f.m[key]
	f.mu.Unlock()
	if !ok || !time.Now().Before(e.until) {
		return ""
	}
	return e.state
}

// raise records that key's tat was seen at tat (ns since the epoch; state is
// the same in the state format), rel ahead of the scripts' now.
func (f *floors) raise(key string, tat int64, state string, rel time.Duration) {
	now := time.Now()
	until := now.Add(max(rel, 0) + floorSlack)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]floor)
	}
	e, seen := f.m[key]
	if !seen {
		e.tat = math.MinInt64
	}
	e.tat = max(e.tat, tat)
	if e.tat == tat { // the latest: an equal tat carries the same text
		e.state = state
	}
	if until.After(e.until) {
		e.until = until
	}
	f.m[key] = e
	f.ops++
	if f.ops == sweepEvery {
		f.ops = 0
		for k, e := range f.m {
			if now.After(e.until) {
				delete(f.m, k)
			}
		}
	}
}

// parseState reads a tat in the state format ("µs.nnn", floor division) as
// nanoseconds since the Unix epoch.
func parseState(v string) (int64, bool) {
	us, ns, ok := strings.Cut(v, ".")
	if !ok || len(ns) != 3 {
		return 0, false
	}
	u, err := strconv.ParseInt(us, 10, 64)
	if err != nil || u > 1<<62/1000 || u < -(1<<62)/1000 {
		return 0, false
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 0 || ns[0] == '-' || ns[0] == '+' {
		return 0, false
	}
	return u*1000 + int64(n), true
}
