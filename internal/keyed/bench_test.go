//go:build !mutation

// The benchmarks use Redis; a mutation run leaves them out of its build.

package keyed_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/keyed/redisclaims"
	"github.com/throttler/throttler/internal/testenv"
)

// BenchmarkSchedChoose is the scheduling cost of one job with n keys that
// all have jobs: choose the key, record its start and its settle. Every
// key runs at 1/s, so each choice passes over keys that are not ready yet;
// the cost must grow like log n, not n (goal: 10,000 keys within 2× of 1).
func BenchmarkSchedChoose(b *testing.B) {
	for _, n := range []int{1, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			s := keyed.New(nil)
			now := time.Unix(1_700_000_000, 0)
			for i := range n {
				s.Add(strconv.Itoa(i), now)
			}
			step := time.Second / time.Duration(n) // the keys' total rate: n/s
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				key, wait := s.Next(now, now)
				if key == "" {
					now = now.Add(wait)
					key, _ = s.Next(now, now)
				}
				s.Started(key, now.Add(time.Second))
				s.Settled(key, now)
				now = now.Add(step)
			}
		})
	}
}

// BenchmarkSchedMemory reports the scheduler's memory per active key.
// With -short (make bench-smoke) only the 10,000-key size runs: each of its
// iterations builds the whole scheduler and collects garbage twice.
func BenchmarkSchedMemory(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		if testing.Short() && n > 10_000 {
			continue
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			var before, after runtime.MemStats
			for range b.N {
				runtime.GC()
				runtime.ReadMemStats(&before)
				s := keyed.New(nil)
				now := time.Unix(1_700_000_000, 0)
				for i := range n {
					s.Add("customer-"+strconv.Itoa(i), now)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/active-key")
				runtime.KeepAlive(s)
			}
		})
	}
}

// BenchmarkRedisPerKey reports Redis memory per active key (its GCRA state
// and its claim) after n keys took a slot, and per idle key once their
// states expired and their claims were released; and the cost of one
// keyed slot (one script call).
func BenchmarkRedisPerKey(b *testing.B) {
	srv := testenv.StartRedis(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	used := func() float64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		b.Fatal("no used_memory in INFO")
		return 0
	}
	store := redisbucket.New(client, redisbucket.DefaultConfig())
	claims := redisclaims.New(client, redisclaims.Config{Instance: "bench"})
	lane := bucket.Limit{Rate: 100_000, Burst: 100}
	kl := bucket.Limit{Rate: 1, Burst: 1}
	const n = 10_000
	b.Run("memory", func(b *testing.B) {
		// One measurement: every further one would give the same figures and
		// cost 10,000 keys and a second's expiry again (-benchtime 100x in
		// make bench-smoke would take minutes).
		for i := range b.N {
			if i > 0 {
				continue
			}
			if err := client.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			base := used()
			keys := make([]string, n)
			for i := range n {
				keys[i] = "customer-" + strconv.Itoa(i)
				if _, err := store.ReservePair(ctx, bucket.Key{Lane: "bench", Sub: keys[i]}, lane, kl, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := claims.Claim(ctx, "bench", keys); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric((used()-base)/n, "B/active-key")
			for _, k := range keys {
				if err := claims.Release(ctx, "bench", k); err != nil {
					b.Fatal(err)
				}
			}
			// Key states live until their bucket is full again (1 s here).
			time.Sleep(1100 * time.Millisecond)
			for range 20 {
				client.Do(ctx, "SCAN", 0, "COUNT", 1000) // let expiry catch up
			}
			left, _ := client.DBSize(ctx).Result()
			b.ReportMetric(float64(left)/n, "redis-keys/idle-key")
		}
	})
	b.Run("reserve", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if _, err := store.ReservePair(ctx, bucket.Key{Lane: "bench", Sub: strconv.Itoa(i % n)}, lane, kl, 0, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
