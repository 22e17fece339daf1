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

// Run with: go test -run '^$' -bench . -benchtime 2000x ./internal/bucket/redisbucket/
// Each benchmark talks to its own redis-server on loopback, so the figures
// are round trips plus script time, not the Go code alone.

// benchGoroutines is the number of concurrent callers RunParallel aims at,
// about what a busy instance has in flight.
const benchGoroutines = 64

// benchClient starts a server and a client with a pool as large as the
// number of callers, so the benchmark measures Redis and not pool waits.
func benchClient(b *testing.B) *redis.Client {
	b.Helper()
	srv := testenv.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: benchGoroutines, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	return c
}

func setParallelism(b *testing.B) {
	b.SetParallelism(max(1, benchGoroutines/runtime.GOMAXPROCS(0)))
}

// BenchmarkAdmitParallel: one admission check per op on 64 lane keys, the
// limit high enough that nothing is refused.
func BenchmarkAdmitParallel(b *testing.B) {
	s := redisbucket.New(benchClient(b), redisbucket.DefaultConfig())
	l := bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst}
	var next atomic.Int64
	setParallelism(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		k := bucket.Key{Lane: "bench", Sub: fmt.Sprint(next.Add(1) % benchGoroutines)}
		for pb.Next() {
			if _, err := s.Admit(ctx, k, l); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRedisRateAllowParallel is BenchmarkAdmitParallel with
// github.com/go-redis/redis_rate, the usual GCRA-in-Redis library, for
// comparison.
func BenchmarkRedisRateAllowParallel(b *testing.B) {
	lim := redis_rate.NewLimiter(benchClient(b))
	l := redis_rate.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst, Period: time.Second}
	var next atomic.Int64
	setParallelism(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := "bench:" + fmt.Sprint(next.Add(1)%benchGoroutines)
		for pb.Next() {
			if _, err := lim.Allow(ctx, key, l); err != nil {
				b.Error(err)
				return
			}
		}
	})
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
