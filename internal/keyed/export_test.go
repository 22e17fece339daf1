package keyed

import (
	"context"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// Test access to the pacer's steps, for the tests in keyed_test (which may
// import the Redis adapters; a test inside the package may not).

// Acquire takes key's in-flight leases, as a step does.
func (k *Pacer[T]) Acquire(ctx context.Context, key string) (string, Full, error) {
	return k.acquire(ctx, key)
}

// ReleaseLeaseAsync gives tok back off the caller's goroutine.
func (k *Pacer[T]) ReleaseLeaseAsync(ctx context.Context, key, tok string) {
	k.releaseLeaseAsync(ctx, key, tok)
}

// WaitReleases waits for the releases under way.
func (k *Pacer[T]) WaitReleases() { k.releases.Wait() }

// HeldLeases counts the tokens this instance counts as held.
func (k *Pacer[T]) HeldLeases() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.leases)
}

// RefreshUntil refreshes the leases held every period until stop closes.
func (k *Pacer[T]) RefreshUntil(ctx context.Context, stop <-chan struct{}, period time.Duration) {
	k.refreshUntil(ctx, stop, period)
}

// TakeNext reads key's next job and takes it, as a step does after its
// reservation, and has it wait on a goroutine of its own for its slot due
// (at most maxLate late). It reports the job taken.
func (k *Pacer[T]) TakeNext(ctx context.Context, key string, due time.Time, maxLate time.Duration) (T, bool) {
	var none T
	msg, readEpoch, ok, err := k.next(ctx, key)
	if err != nil || !ok {
		return none, false
	}
	epoch, prev, decided, ok := k.take(key, msg, readEpoch)
	if !ok {
		return none, false
	}
	k.permits <- struct{}{}
	k.inflight.Add(1)
	k.waiting.Add(1)
	p := &permit{release: k.giveBackFn}
	go k.startAt(ctx, ctx, &job[T]{key: key, msg: msg, due: due, theo: due, keyPeriod: k.KeyLimit(key, due).Period(), maxLate: maxLate, epoch: epoch, prev: prev, decided: decided, permit: p})
	return msg, true
}

// StepSlots are the loop's step slots: take waits for one of n (false when
// ctx ends first), finish gives one back.
func StepSlots(n int) (take func(context.Context) bool, finish func()) {
	st := &steps{done: make(chan struct{}, 1)}
	return func(ctx context.Context) bool { return st.slot(ctx, n) },
		func() { st.finish(rest{}, time.Time{}, true) }
}

// ConcurrentSteps is how many steps run at once under the lane's limit l.
func ConcurrentSteps(l bucket.Limit) int { return concurrentSteps(l) }

// WaitStarts waits for the jobs taken to start or go back.
func (k *Pacer[T]) WaitStarts() { k.waiting.Wait() }

// Step runs one step of the loop at the lane's next slot laneNext, and
// reports its rest: how long, whether the scheduler's news ends it, and
// whether the run should stop.
func (k *Pacer[T]) Step(ctx context.Context, laneNext *time.Time) (d time.Duration, wake, stop bool) {
	st := &steps{laneNext: *laneNext, done: make(chan struct{}, 1)}
	r := k.step(ctx, ctx, st, 1)
	*laneNext = st.laneNext
	return r.d, r.wake, r.stop
}

// Claim claims keys, as the claimer does when they got jobs.
func (k *Pacer[T]) Claim(ctx context.Context, keys ...string) { k.claim(ctx, keys) }

// Release gives up the keys that went idle, as the claimer does.
func (k *Pacer[T]) Release(ctx context.Context) { k.release(ctx) }

// Idled lists the keys waiting to be released.
func (k *Pacer[T]) Idled() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for key := range k.idled {
		out = append(out, key)
	}
	return out
}

// Permits counts the permits held.
func (k *Pacer[T]) Permits() int { return len(k.permits) }

// Tries is the count of failed attempts kept for seq.
func (k *Pacer[T]) Tries(seq uint64) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tries[seq]
}

// Lookahead, RetryWait, LeasePoll and BounceAfter are the loop's waits.
const (
	Lookahead   = lookahead
	RetryWait   = retryWait
	LeasePoll   = leasePoll
	BounceAfter = bounceAfter
)

// ClaimPending claims the keys announced, as the claimer does when woken.
func (k *Pacer[T]) ClaimPending(ctx context.Context) { k.claimPending(ctx) }

// RefreshLeases refreshes the leases held, as the claimer does.
func (k *Pacer[T]) RefreshLeases(ctx context.Context) { k.refreshLeases(ctx) }

// Deciding counts the keys whose last job taken has not decided yet.
func (k *Pacer[T]) Deciding() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.decided)
}

// Held is how many keys s holds a factor for, without sweeping.
func (s *Slowdown) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}
