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
	"container/heap"
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
)

type entry struct {
	key      string
	st       state
	idx      int // index in its heap
	eligible time.Time
	paused   time.Time
	start    float64 // SFQ start tag while ready
	finish   float64 // SFQ finish tag of its last start
	opts     Opts
	inflight int
	more     bool // a job was stored while busy: an empty read may be stale
	seq      uint64
}

// Sched chooses the next key. The zero value is not ready; use New.
type Sched struct {
	mu      sync.Mutex
	keys    map[string]*entry
	wait    waitHeap
	ready   readyHeap
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
	return &Sched{keys: map[string]*entry{}, optsFor: optsFor, wake: make(chan struct{}, 1)}
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
		e = &entry{key: key, opts: norm(s.optsFor(key)), eligible: now, seq: s.seq, finish: s.vtime}
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
	heap.Push(&s.wait, e)
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
	for s.wait.Len() > 0 && !s.wait[0].eligible.After(horizon) {
		e := heap.Pop(&s.wait).(*entry)
		e.st, e.start = ready, max(e.finish, s.vtime)
		heap.Push(&s.ready, e)
	}
	if s.ready.Len() == 0 {
		if s.wait.Len() == 0 {
			return "", -1
		}
		return "", max(s.wait[0].eligible.Sub(now), 0)
	}
	e := heap.Pop(&s.ready).(*entry)
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
	e.finish -= 1 / e.opts.Weight
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
	e.finish -= 1 / e.opts.Weight
	switch {
	case e.more:
		e.more = false
		s.toWaiting(e, now)
	case e.inflight == 0:
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
	if e.inflight > 0 {
		e.inflight--
	}
	switch {
	case e.st == blocked && e.inflight < e.opts.MaxInflight:
		s.toWaiting(e, later(now, e.eligible))
		s.signal()
	case e.st == drained && e.inflight == 0:
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
			heap.Fix(&s.wait, e.idx)
		}
	case ready:
		heap.Remove(&s.ready, e.idx)
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
	switch e.st {
	case waiting:
		heap.Remove(&s.wait, e.idx)
	case ready:
		heap.Remove(&s.ready, e.idx)
	}
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
		if e.st == waiting {
			heap.Remove(&s.wait, e.idx)
		} else {
			heap.Remove(&s.ready, e.idx)
		}
		e.st = held
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
}

// Key reports key's state.
func (s *Sched) Key(key string) KeyState {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil {
		return KeyState{}
	}
	return KeyState{Known: true, Inflight: e.inflight, Paused: e.paused, Eligible: e.eligible}
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

// waitHeap orders keys by eligible, then by arrival.
type waitHeap []*entry

func (h waitHeap) Len() int { return len(h) }
func (h waitHeap) Less(i, j int) bool {
	if !h[i].eligible.Equal(h[j].eligible) {
		return h[i].eligible.Before(h[j].eligible)
	}
	return h[i].seq < h[j].seq
}
func (h waitHeap) Swap(i, j int)  { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *waitHeap) Push(x any)    { e := x.(*entry); e.idx = len(*h); *h = append(*h, e) }
func (h *waitHeap) Pop() any      { return pop((*[]*entry)(h)) }
func (h readyHeap) Len() int      { return len(h) }
func (h readyHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *readyHeap) Push(x any)   { e := x.(*entry); e.idx = len(*h); *h = append(*h, e) }
func (h *readyHeap) Pop() any     { return pop((*[]*entry)(h)) }

// readyHeap orders keys by start tag, then by arrival.
type readyHeap []*entry

func (h readyHeap) Less(i, j int) bool {
	if h[i].start != h[j].start {
		return h[i].start < h[j].start
	}
	return h[i].seq < h[j].seq
}

func pop(h *[]*entry) any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	e.idx = -1
	return e
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}
