//go:build mutation

package keyed_test

import (
	"testing"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/clock"
)

// pairStores runs f against the in-memory pair store only in a mutation
// run (`make mutate-keyed`): the scheduling code under test is the same
// whichever store answers, and a test binary without Redis and NATS links
// in seconds instead of tens of them, once per mutant. Every other run
// also runs f against Redis (pairstores_test.go).
func pairStores(t *testing.T, f func(t *testing.T, c *clock.Manual, s bucket.PairStore)) {
	t.Run("memory", func(t *testing.T) {
		c := buckettest.NewClock()
		f(t, c, &bucket.Memory{Clock: c})
	})
}
