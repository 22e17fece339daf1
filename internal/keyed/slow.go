package keyed

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/throttler/throttler/internal/leaky"
)

// Slowdown is adaptive mode per key (per_key.adaptive): each key whose
// downstream pushes back gets its own leaky.AIMD factor, which multiplies
// that key's rate and nothing else. A key is held only while its factor is
// below 1: a key never slowed down, or recovered, costs no memory.
//
// Set the fields before first use. Safe for concurrent use. Methods take
// now so that tests drive time.
type Slowdown struct {
	// Decrease, Increase, Min and Interval are leaky.AIMD's.
	Decrease, Increase, Min float64
	Interval                time.Duration

	mu   sync.Mutex
	keys map[string]*leaky.AIMD
}

func (s *Slowdown) aimd() *leaky.AIMD {
	return &leaky.AIMD{Decrease: s.Decrease, Increase: s.Increase, Min: s.Min, Interval: s.Interval}
}

// Factor is key's multiplier at now: 1 unless it was slowed down and has
// not recovered yet.
func (s *Slowdown) Factor(key string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.keys[key]
	if a == nil {
		return 1
	}
	f := a.Factor(now)
	if f >= 1 {
		delete(s.keys, key)
	}
	return f
}

// Limited records a push-back of key's downstream at now: the factor drops
// by Decrease, at most once per Interval. It returns the factor and
// whether this answer changed it.
func (s *Slowdown) Limited(key string, now time.Time) (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.keys[key]
	if a == nil {
		a = s.aimd()
		if s.keys == nil {
			s.keys = map[string]*leaky.AIMD{}
		}
		s.keys[key] = a
	}
	return a.Limited(now)
}

// Adopt takes key's factor decided at at (by another instance, or before
// this one claimed the key), if it is lower than the one held; it recovers
// from at as if decided here. A factor of 1 or more is never lower.
func (s *Slowdown) Adopt(key string, factor float64, at, now time.Time) {
	if !(factor > 0) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.keys[key]
	fresh := a == nil
	if fresh {
		a = s.aimd()
	}
	a.Adopt(factor, at)
	if a.Factor(now) >= 1 {
		if !fresh {
			delete(s.keys, key)
		}
		return
	}
	if s.keys == nil {
		s.keys = map[string]*leaky.AIMD{}
	}
	s.keys[key] = a
}

// Recovery is how long a factor takes to climb back to 1 when nothing
// pushes back: how long a shared copy of it has to live.
func (s *Slowdown) Recovery(factor float64) time.Duration {
	if s.Increase <= 0 {
		return 0
	}
	// None for a factor of 1 or more.
	steps := max(math.Ceil((1-factor)/s.Increase-1e-9), 0)
	return time.Duration(steps) * s.Interval
}

// Sweep forgets the keys that recovered by now and returns how many keys
// are still slowed down.
func (s *Slowdown) Sweep(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, a := range s.keys {
		if a.Factor(now) >= 1 {
			delete(s.keys, k)
		}
	}
	return len(s.keys)
}

// SlowState is a key's factor as stored for the other instances: Factor
// was decided Age ago.
type SlowState struct {
	Key    string
	Factor float64
	Age    time.Duration
}

// SlowStore shares keys' slow-downs between the instances of a fleet, so
// that a key keeps its factor when another instance takes it over (claims
// move with the traffic). A stored factor lives until it would have
// recovered (Slowdown.Recovery), so an idle key leaves nothing behind.
type SlowStore interface {
	// SaveSlow stores key's factor, decided now, for ttl.
	SaveSlow(ctx context.Context, lane, key string, factor float64, ttl time.Duration) error
	// LoadSlow returns the stored factors of those of keys that have one.
	LoadSlow(ctx context.Context, lane string, keys []string) ([]SlowState, error)
}
