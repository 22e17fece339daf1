//go:build !mutation

// Benchmarks are left out of a mutation run (build tag mutation), which
// builds the tests once per mutant and runs no benchmark.

package redisbucket_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/testenv"
)

// Run with: go test -run '^$' -bench . -benchmem ./internal/bucket/redisbucket/
// Each benchmark talks to a redis-server on loopback, so the figures are
// round trips plus script time, not the Go code alone.

// benchGoroutines is the number of concurrent callers RunParallel aims at,
// about what a busy instance has in flight.
const benchGoroutines = 64

// benchClient starts a server and a client with a pool as large as the
// number of callers, so the benchmark measures Redis and not pool waits.
func benchClient(b *testing.B) *redis.Client {
	b.Helper()
	return benchClientOn(b, testenv.StartRedis(b).Addr)
}

func benchClientOn(b *testing.B, addr string) *redis.Client {
	b.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: benchGoroutines, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	return c
}

func setParallelism(b *testing.B) {
	b.SetParallelism(max(1, benchGoroutines/runtime.GOMAXPROCS(0)))
}

// BenchmarkAdmission: admission decisions from 64 goroutines on 64 keys, the
// limit high enough that nothing is refused, on one redis-server shared by
// the sub-benchmarks, so that their figures compare:
//
//   - lib=throttler/client=autopipeline is the store as the service runs it
//     (go-redis's AutoPipeline: concurrent calls share one round trip);
//   - lib=throttler/client=plain is the store on a plain client, one round
//     trip per call;
//   - lib=redis_rate/client=plain is github.com/go-redis/redis_rate/v10
//     Allow, the usual GCRA-in-Redis library, as it is normally used;
//   - lib=redis_rate/client=autopipeline is redis_rate on the autopipeliner,
//     to show how much of the difference is pipelining alone.
//
// ns/op is wall time per decision across all goroutines: 1e9/ns/op is
// decisions per second.
func BenchmarkAdmission(b *testing.B) {
	addr := testenv.StartRedis(b).Addr
	plain := benchClientOn(b, addr)
	pipe, err := benchClientOn(b, addr).AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pipe.Close() })
	clients := []struct {
		name string
		c    redis.Cmdable
	}{{"plain", plain}, {"autopipeline", pipe}}
	for _, c := range clients {
		b.Run("lib=throttler/client="+c.name, func(b *testing.B) {
			s := redisbucket.New(c.c, redisbucket.DefaultConfig())
			l := bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst}
			var next atomic.Int64
			setParallelism(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				k := bucket.Key{Lane: "bench-" + c.name, Sub: fmt.Sprint(next.Add(1) % benchGoroutines)}
				for pb.Next() {
					if _, err := s.Admit(ctx, k, l); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	for _, c := range clients {
		b.Run("lib=redis_rate/client="+c.name, func(b *testing.B) {
			lim := redis_rate.NewLimiter(c.c)
			l := redis_rate.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst, Period: time.Second}
			var next atomic.Int64
			setParallelism(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := "bench:" + c.name + ":" + fmt.Sprint(next.Add(1)%benchGoroutines)
				for pb.Next() {
					if _, err := lim.Allow(ctx, key, l); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkReserveBatch: the drain reserving n slots per call. ns/slot
// falls as n rises, which is what lets high-rate lanes go through Redis.
func BenchmarkReserveBatch(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s := redisbucket.New(benchClient(b), redisbucket.DefaultConfig())
			l := bucket.Limit{Rate: bucket.MaxRate, Burst: 1000}
			var next atomic.Int64
			setParallelism(b)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				k := bucket.Key{Lane: "bench", Sub: fmt.Sprint(next.Add(1) % benchGoroutines)}
				for pb.Next() {
					if _, err := s.Reserve(ctx, k, l, n); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*n), "ns/slot")
		})
	}
}
