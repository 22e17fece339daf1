package redisquota_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/redisquota"
	"github.com/throttler/throttler/internal/testenv"
)

// Run with: go test -run '^$' -bench . -benchmem ./internal/quota/redisquota/
//
// BenchmarkCheck: caller quota checks from 64 goroutines, each its own IP
// and key, limits high enough that nothing is refused, on the
// autopipeliner the service uses; layers=both is one script for the
// per-IP window and the plan bucket, layers=lane is the lane's admission
// peek (redisbucket) on the same server, for comparison.
func BenchmarkCheck(b *testing.B) {
	rs := testenv.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: rs.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	pipe, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pipe.Close() })
	lim := bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst}
	run := func(b *testing.B, op func(ctx context.Context, i int) error) {
		b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
		b.ReportAllocs()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1))
			for pb.Next() {
				if err := op(context.Background(), i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	s := redisquota.New(pipe, redisquota.Config{})
	for _, tc := range []struct {
		name string
		ip   bool
		plan bool
	}{{"both", true, true}, {"ip", true, false}, {"plan", false, true}} {
		b.Run("layers="+tc.name, func(b *testing.B) {
			run(b, func(ctx context.Context, i int) error {
				r := quota.Request{}
				if tc.ip {
					r.IP, r.PerIP = "10.0.0."+strconv.Itoa(i), quota.Window{Limit: 1_000_000_000, Length: time.Hour}
				}
				if tc.plan {
					r.Caller, r.Plan, r.Cost = "key:"+strconv.Itoa(i), lim, 1
				}
				_, err := s.Check(ctx, r)
				return err
			})
		})
	}
	store := redisbucket.New(pipe, redisbucket.DefaultConfig())
	b.Run("layers=lane", func(b *testing.B) {
		run(b, func(ctx context.Context, i int) error {
			_, err := store.Peek(ctx, bucket.Key{Lane: "lane-" + strconv.Itoa(i)}, lim)
			return err
		})
	})
}
