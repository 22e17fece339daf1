package bucket

import (
	"context"
	"errors"
	"time"
)

// ErrUnavailable wraps every error of a store whose backend cannot be reached
// (Redis down, timeouts). Callers fall back to their safe answer: admission
// queues, the drain waits. It never means a limit was exceeded.
var ErrUnavailable = errors.New("bucket: state store unavailable")

// Key names one GCRA state: a lane, or one key of a keyed lane.
type Key struct {
	Lane string
	// Sub is the key within a keyed lane (an endpoint, a customer); empty for
	// the lane-wide state.
	Sub string
}

// String formats the key as "lane" or "lane/sub".
func (k Key) String() string {
	if k.Sub == "" {
		return k.Lane
	}
	return k.Lane + "/" + k.Sub
}

// Store keeps GCRA states and applies the algorithm's steps to them atomically.
// Implementations are safe for concurrent use; every method validates the
// limit first and returns an error wrapping ErrInvalidLimit for a bad one.
// Durations in results are measured from the store's own clock reading, which
// the caller treats as "now" when the call returns: network latency then only
// delays a slot, it never brings one forward.
type Store interface {
	// Admit takes one token when the bucket has one (see the package Admit).
	Admit(ctx context.Context, k Key, l Limit) (Decision, error)
	// Reserve reserves n consecutive dispatch slots (see the package Reserve).
	Reserve(ctx context.Context, k Key, l Limit, n int) (Reservation, error)
	// Peek reports what Admit would answer without taking anything.
	Peek(ctx context.Context, k Key, l Limit) (Decision, error)
	// Pause keeps every slot of k from starting for d from now (see Pause).
	Pause(ctx context.Context, k Key, l Limit, d time.Duration) error
}
