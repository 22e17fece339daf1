//go:build !mutation

package keyed_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/testenv"
)

// pairStores runs f against the in-memory and the Redis pair store, both
// reading the manual clock: the scheduling algorithm must give the same
// answers on both pacers.
func pairStores(t *testing.T, f func(t *testing.T, c *clock.Manual, s bucket.PairStore)) {
	t.Run("memory", func(t *testing.T) {
		c := buckettest.NewClock()
		f(t, c, &bucket.Memory{Clock: c})
	})
	t.Run("redis", func(t *testing.T) {
		srv := testenv.StartRedis(t)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		c := buckettest.NewClock()
		cfg := redisbucket.DefaultConfig()
		cfg.Clock = c
		// The schedule runs on the manual clock; only the calls to
		// Redis take real time. DefaultTimeout (500 ms) is the
		// service's bound on a call, not a property of the schedule:
		// on a loaded machine a call outlived it and failed a
		// simulation (TestLaneCapSharedByWeight, "context deadline
		// exceeded"). redisbucket's own tests check the timeout.
		cfg.Timeout = 10 * time.Second
		f(t, c, redisbucket.New(client, cfg))
	})
}
