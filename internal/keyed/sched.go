// Package keyed chooses which key of a keyed lane starts its next job.
//
// A keyed lane has a bucket per key (its own rate, burst, in-flight bound,
// weight and pause) under the lane-wide cap. Sched keeps the keys that have
// jobs on this instance in two heaps: the keys waiting for their own next
// slot, ordered by when it comes (eligible), and the keys that may start
// now, ordered by a start tag of start-time fair queuing (SFQ): a key that
// becomes ready gets S = max(F, V), where F is its last finish tag and V the
// start tag of the key chosen last; choosing it sets V = S and F = S +
// 1/weight. So when the lane-wide cap binds, ready keys share it in
// proportion to their weights (weighted round robin, no key starves); when
// it does not, every key starts as soon as its own slot comes. Choosing the
// next key costs O(log n) in the number of keys with jobs; keys without
// jobs are forgotten (no memory).
//
// Sched is pure: it does no I/O and takes the time as an argument. The lane
// runtime reads each chosen key's next job, reserves its slot from the
// shared state (bucket.PairStore) and tells Sched the outcome. Safe for
// concurrent use.
package keyed

import (
	"cmp"
	"sync"
	"time"
)

// Opts are one key's scheduling settings.
type Opts struct {
	// Weight is the key's share when the lane-wide cap binds; 0 means 1.
	Weight float64
	// MaxInflight bounds the key's jobs started and not yet settled; 0
	// means 1. A key at its bound is not chosen until one settles.
	MaxInflight int
	// Paused holds the key (an operator paused it) until it is cleared.
	Paused bool
}

type state int8

const (
	waiting state = iota // in the waiting heap, until its own next slot
	ready                // in the ready heap: may start now
	busy                 // chosen: the runtime reads and reserves for it
	blocked              // at its in-flight bound
	drained              // no job left to read, jobs still in flight
	held                 // paused by its settings (Opts.Paused)
	gone                 // forgotten
)

type entry struct {
	key      string
	st       state
	gen      uint32 // its one valid heap item carries this (older ones are stale)
	eligible time.Time
	paused   time.Time
	start    float64 // SFQ start tag while ready
	finish   float64 // SFQ finish tag of its last start
	opts     Opts
	inflight int
	more     bool // a job was stored while busy: an empty read may be stale
	seq      uint64
	since    time.Time // when it became known (Add)
}

// Sched chooses the next key. The zero value is not ready; use New.
type Sched struct {
	mu      sync.Mutex
	keys    map[string]*entry
	wait    kheap
	ready   kheap
	vtime   float64
	seq     uint64
	optsFor func(key string) Opts
	wake    chan struct{}
}

// New returns an empty Sched; optsFor gives a key's settings when it gets
// jobs (nil: defaults).
func New(optsFor func(key string) Opts) *Sched {
	if optsFor == nil {
		optsFor = func(string) Opts { return Opts{} }
	}
	return &Sched{keys: map[string]*entry{}, optsFor: optsFor, wake: make(chan struct{}, 1), ready: kheap{byTag: true}}
}

// Wake is signalled when a key may have become ready earlier than the last
// Next said (a key got jobs, a job settled, settings changed).
func (s *Sched) Wake() <-chan struct{} { return s.wake }

func (s *Sched) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func norm(o Opts) Opts {
	if o.Weight <= 0 {
		o.Weight = 1
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 1
	}
	return o
}

// Add says key has a new job (stored, or handed back to wait in place). It
// reports whether the key was unknown (the caller may have to claim it).
func (s *Sched) Add(key string, now time.Time) (isNew bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.keys[key]
	if !ok {
		s.seq++
		e = &entry{key: key, opts: norm(s.optsFor(key)), eligible: now, seq: s.seq, finish: s.vtime, since: now}
		s.keys[key] = e
		s.toWaiting(e, now)
		s.signal()
		return true
	}
	switch e.st {
	case busy:
		e.more = true
	case drained:
		s.toWaiting(e, now)
		s.signal()
	}
	return false
}

// toWaiting puts e in the waiting heap at the later of at and its pause
// (held instead while its settings pause it).
func (s *Sched) toWaiting(e *entry, at time.Time) {
	if e.opts.Paused {
		e.eligible, e.st = at, held
		return
	}
	if at.Before(e.paused) {
		at = e.paused
	}
	e.eligible, e.st = at, waiting
	s.wait.push(e)
}

// Next chooses the ready key with the smallest start tag, counting as ready
// every key whose own next slot comes by horizon (the lane's next slot; at
// least now). The chosen key is busy until Started, NotReady or Empty. With
// no key ready it returns "" and how long until the first waiting one
// (ok false and wait < 0 when no key has jobs).
func (s *Sched) Next(now, horizon time.Time) (key string, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if horizon.Before(now) {
		horizon = now
	}
	h := horizon.UnixNano()
	for it := s.wait.top(waiting); it != nil && it.at <= h; it = s.wait.top(waiting) {
		e := s.wait.pop()
		e.st, e.start = ready, max(e.finish, s.vtime)
		s.ready.push(e)
	}
	if s.ready.top(ready) == nil {
		it := s.wait.top(waiting)
		if it == nil {
			return "", -1
		}
		return "", max(it.e.eligible.Sub(now), 0)
	}
	e := s.ready.pop()
	s.vtime = e.start
	e.finish = e.start + 1/e.opts.Weight
	e.st, e.more = busy, false
	return e.key, 0
}

// Started says the busy key started a job; its own next slot comes at
// next.
func (s *Sched) Started(key string, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.st != busy {
		return
	}
	e.inflight++
	e.eligible = next
	if e.inflight >= e.opts.MaxInflight {
		e.st = blocked
		return
	}
	s.toWaiting(e, next)
}

// NotReady says the busy key could not take a slot: its own next one comes
// at next. Its finish tag is given back, so it loses no share.
func (s *Sched) NotReady(key string, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.st != busy {
		return
	}
	e.finish = e.start // it did not use its turn
	e.eligible = next
	s.toWaiting(e, next)
}

// Empty says the busy key had no job to read. It reports whether the key is
// now idle (forgotten: the caller releases its claim); a key with jobs in
// flight stays, drained, until they settle.
func (s *Sched) Empty(key string, now time.Time) (idle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || e.st != busy {
		return false
	}
	e.finish = e.start // it did not use its turn
	switch {
	case e.more:
		e.more = false
		s.toWaiting(e, now)
	case e.inflight == 0:
		e.st = gone
		delete(s.keys, key)
		return true
	default:
		e.st = drained
	}
	return false
}

// Settled says one of key's jobs settled (done, retried later, dead, or
// handed back). It reports whether the key is now idle (see Empty).
func (s *Sched) Settled(key string, now time.Time) (idle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil {
		return false
	}
	e.inflight = max(e.inflight-1, 0)
	switch {
	case e.st == blocked && e.inflight < e.opts.MaxInflight:
		s.toWaiting(e, later(now, e.eligible))
		s.signal()
	case e.st == drained && e.inflight == 0:
		e.st = gone
		delete(s.keys, key)
		return true
	}
	return false
}

// Pause keeps key from being chosen before until (a downstream asked it to
// wait); a shorter pause never shortens a longer one.
func (s *Sched) Pause(key string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || !until.After(e.paused) {
		return
	}
	e.paused = until
	switch e.st {
	case waiting:
		if e.eligible.Before(until) {
			e.eligible = until
			s.wait.push(e) // the older item goes stale
		}
	case ready:
		e.finish = e.start // it did not use its turn
		s.toWaiting(e, until)
	}
}

// Forget drops key whatever its state (its claim was lost to another
// instance); it reports whether it was known.
func (s *Sched) Forget(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil {
		return false
	}
	e.st, e.gen = gone, e.gen+1 // its heap items go stale
	delete(s.keys, key)
	return true
}

// SetOpts changes key's settings if it is known.
func (s *Sched) SetOpts(key string, o Opts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil {
		return
	}
	e.opts = norm(o)
	switch {
	case o.Paused && (e.st == waiting || e.st == ready):
		e.st, e.gen = held, e.gen+1
	case !o.Paused && e.st == held, e.st == blocked && e.inflight < e.opts.MaxInflight:
		s.toWaiting(e, e.eligible)
	}
	s.signal()
}

// Stats are counts for the lane's metrics.
type Stats struct {
	// Active: keys with jobs on this instance.
	Active int
	// Paused: of those, keys a downstream asked to wait, at now.
	Paused int
	// Inflight: their jobs started and not settled.
	Inflight int
}

// Stats counts the keys (O(n): for metrics scrapes and status).
func (s *Sched) Stats(now time.Time) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Active: len(s.keys)}
	for _, e := range s.keys {
		if e.paused.After(now) || e.opts.Paused {
			st.Paused++
		}
		st.Inflight += e.inflight
	}
	return st
}

// KeyState is one key's scheduling state, for the admin API.
type KeyState struct {
	Known    bool
	Inflight int
	Paused   time.Time
	Eligible time.Time
	// Since is when the key became known (Add), not moved by later Adds
	// while it stays known.
	Since time.Time
}

// Key reports key's state.
func (s *Sched) Key(key string) KeyState {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil {
		return KeyState{}
	}
	return KeyState{Known: true, Inflight: e.inflight, Paused: e.paused, Eligible: e.eligible, Since: e.since}
}

// Keys lists the known keys (for refreshing claims).
func (s *Sched) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.keys))
	for k := range s.keys {
		out = append(out, k)
	}
	return out
}

// kheap is a binary heap of keys with their sort keys held inline, so that
// comparisons and moves touch only the heap's own array (10,000 keys and
// more do not fit a CPU cache; following each key's pointer per level would
// cost a cache miss per level). A key is removed lazily: its entry's
// generation moves on, and an item of an older generation is dropped when
// it reaches the top. The waiting heap orders by eligible time, the ready
// heap by start tag (byTag); ties go to the key that came first.
type kheap struct {
	items []item
	byTag bool
}

type item struct {
	at  int64   // eligible, Unix ns (waiting heap)
	tag float64 // start tag (ready heap)
	seq uint64
	gen uint32
	e   *entry
}

func (h *kheap) less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	// cmp.Less, not <: past the != a comparison's boundary (<=) changes
	// nothing, and a mutation run would count it alive (docs/MUTATION.md).
	if h.byTag {
		if a.tag != b.tag {
			return cmp.Less(a.tag, b.tag)
		}
	} else if a.at != b.at {
		return cmp.Less(a.at, b.at)
	}
	return cmp.Less(a.seq, b.seq)
}

func (h *kheap) up(j int) {
	for j != 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.items[i], h.items[j] = h.items[j], h.items[i]
		j = i
	}
}

func (h *kheap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && h.less(r, l) {
			j = r
		}
		if !h.less(j, i) {
			return
		}
		h.items[i], h.items[j] = h.items[j], h.items[i]
		i = j
	}
}

// push adds e (as of now: its eligible time or start tag); any item of e
// already in a heap goes stale.
func (h *kheap) push(e *entry) {
	e.gen++
	it := item{seq: e.seq, gen: e.gen, e: e}
	if h.byTag {
		it.tag = e.start
	} else {
		it.at = e.eligible.UnixNano()
	}
	h.items = append(h.items, it)
	h.up(len(h.items) - 1)
}

// top is the first valid item (the entry in state st), or nil.
func (h *kheap) top(st state) *item {
	for len(h.items) > 0 {
		it := &h.items[0]
		if it.gen == it.e.gen && it.e.st == st {
			return it
		}
		h.pop()
	}
	return nil
}

func (h *kheap) pop() *entry {
	n := len(h.items) - 1
	e := h.items[0].e
	h.items[0] = h.items[n]
	h.items[n] = item{}
	h.items = h.items[:n]
	h.down(0) // an empty heap: nothing to do
	return e
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}
