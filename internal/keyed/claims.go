package keyed

import "context"

// Claims decides which instance reads a key's jobs: one at a time, so that
// a key's jobs start in order and a key costs one reader whatever the
// number of instances. A key is claimed when it gets jobs and released when
// it has none left; the claim of an instance that stops answering lapses,
// and another instance takes the key over.
type Claims interface {
	// Claim takes those of keys that no live instance holds (or that this
	// instance already holds) and returns them. It also refreshes this
	// instance's liveness for lane.
	Claim(ctx context.Context, lane string, keys []string) ([]string, error)
	// Release gives key up (it has no jobs left on this instance).
	Release(ctx context.Context, lane, key string) error
}

// Local is the Claims of a single instance (the embedded pacer): every key
// is its own.
type Local struct{}

var _ Claims = Local{}

// Claim implements Claims: every key.
func (Local) Claim(_ context.Context, _ string, keys []string) ([]string, error) { return keys, nil }

// Release implements Claims: nothing to give up.
func (Local) Release(context.Context, string, string) error { return nil }

// Leases bound jobs in flight across a fleet: a keyed lane's max_inflight
// and each key's. Every start holds an in-flight lease of the lane and one
// of its key under a token, until it is settled; a lease lives for a time
// that its holder refreshes, so the leases of an instance that crashed
// come back by themselves. The memory pacer has none: its single instance
// bounds its own jobs. (A slot, elsewhere, is a start time reserved from a
// GCRA state; a lease is a place among the jobs in flight.)
type Leases interface {
	// Acquire takes a lease of lane (at most laneMax held) and one of key
	// (at most keyMax) for token: both, or neither (Full says which bound
	// refused).
	Acquire(ctx context.Context, lane, key, token string, laneMax, keyMax int) (Full, error)
	// ReleaseLease gives token's leases back.
	ReleaseLease(ctx context.Context, lane, key, token string) error
	// Refresh extends the leases held (token → key).
	Refresh(ctx context.Context, lane string, held map[string]string) error
	// Held counts key's leases held across the fleet: its jobs started (or
	// about to) and not settled.
	Held(ctx context.Context, lane, key string) (int, error)
}

// Full is the answer of Leases.Acquire.
type Full int8

const (
	// Taken: both slots are the token's.
	Taken Full = iota
	// KeyFull: the key has keyMax jobs in flight across the fleet.
	KeyFull
	// LaneFull: the lane has laneMax jobs in flight across the fleet.
	LaneFull
)
