package ingest

import (
	"net/http"
	"sync"
	"sync/atomic"
)

// budget bounds the bytes of request bodies being read at once, in all
// and per caller (API key, else client IP), so that one caller's stalled
// uploads cannot refuse the others. A nil budget has no bound. Safe for
// concurrent use.
type budget struct {
	max       int64
	perCaller int64 // 0: no bound per caller
	used      atomic.Int64

	mu      sync.Mutex // guards callers
	callers map[bodyCaller]int64
}

// bodyCaller is who holds a part of the budget: an API key's id, else a
// client IP (a struct rather than a joined string: no allocation).
type bodyCaller struct{ key, ip string }

// bodyCallerOf is the caller of r for the budget.
func bodyCallerOf(r *http.Request) bodyCaller {
	if id, ok := r.Context().Value(callerCtx{}).(string); ok {
		return bodyCaller{key: id}
	}
	// An IPv6 client by its /64, as the connection share and the per-IP
	// quota count it: one host rotating its addresses is one caller.
	return bodyCaller{ip: ipKey(clientIP(r))}
}

// reservation is what reserve took, to hand to give exactly once.
type reservation struct {
	n   int64
	who bodyCaller
}

// budgetFull says which bound a reservation would go over.
type budgetFull int

const (
	budgetOK       budgetFull = iota
	budgetAll                 // max_body_inflight
	budgetOfCaller            // max_body_inflight_per_caller
)

func newBudget(max, perCaller int64) *budget {
	if max <= 0 {
		return nil
	}
	if perCaller <= 0 || perCaller > max {
		perCaller = 0
	}
	return &budget{max: max, perCaller: perCaller, callers: map[bodyCaller]int64{}}
}

// take reserves a body's bytes: its length, or limit when the length is
// unknown (-1). ok is false when that would go over a bound; release gives
// the bytes back.
func (b *budget) take(who bodyCaller, length, limit int64) (release func(), full budgetFull) {
	res, full := b.reserve(who, length, limit)
	if full != budgetOK {
		return nil, full
	}
	var once sync.Once
	return func() { once.Do(func() { b.give(res) }) }, budgetOK
}

// reserve is take without a closure (the submit path calls it for every
// job): it returns the reservation, to hand to give exactly once. The
// caller's share is checked first, so that a caller over it is told so
// rather than that the server is full.
func (b *budget) reserve(who bodyCaller, length, limit int64) (reservation, budgetFull) {
	n := length
	if n < 0 {
		n = limit
	}
	if b == nil || n == 0 {
		return reservation{}, budgetOK
	}
	if b.perCaller > 0 {
		b.mu.Lock()
		held := b.callers[who]
		if held+n > b.perCaller {
			b.mu.Unlock()
			return reservation{}, budgetOfCaller
		}
		if !b.reserveAll(n) {
			b.mu.Unlock()
			return reservation{}, budgetAll
		}
		b.callers[who] = held + n
		b.mu.Unlock()
		return reservation{n: n, who: who}, budgetOK
	}
	if !b.reserveAll(n) {
		return reservation{}, budgetAll
	}
	return reservation{n: n}, budgetOK
}

// reserveAll takes n bytes of the whole budget if they fit.
func (b *budget) reserveAll(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// giveOnce returns what *res holds and empties it, so that a later call
// (a deferred one) gives nothing.
func (b *budget) giveOnce(res *reservation) {
	b.give(*res)
	*res = reservation{}
}

// give returns what reserve took.
func (b *budget) give(res reservation) {
	if b == nil || res.n == 0 {
		return
	}
	if b.perCaller > 0 {
		b.mu.Lock()
		if left := b.callers[res.who] - res.n; left > 0 {
			b.callers[res.who] = left
		} else {
			delete(b.callers, res.who)
		}
		b.mu.Unlock()
	}
	b.used.Add(-res.n)
}

// heldBy is the bytes who holds now (0 without a bound per caller).
func (b *budget) heldBy(who bodyCaller) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.callers[who]
}

// fullRefusal is the refusal of a body the budget has no room for: 429
// naming the caller's share, or 503 naming the whole budget; the
// connection is closed either way (the body is not read).
func (b *budget) fullRefusal(w http.ResponseWriter, full budgetFull) error {
	w.Header().Set("Connection", "close")
	if full == budgetOfCaller {
		return refusal(ErrCallerBodiesBusy, "", "your request bodies being read at once would go over your share of %d bytes (http.max_body_inflight_per_caller); retry when one is done", b.perCaller)
	}
	return errBodiesBusy
}
