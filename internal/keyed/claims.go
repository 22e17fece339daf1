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
