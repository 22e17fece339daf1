package redisquota_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/quotatest"
	"github.com/throttler/throttler/internal/quota/redisquota"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

var prefixes atomic.Int64

func TestConformance(t *testing.T) {
	rs := testenv.StartRedis(t)
	c := client(t, rs.URL())
	quotatest.Run(t, func(_ *testing.T, mc *clock.Manual) quota.Limiter {
		return redisquota.New(c, redisquota.Config{Prefix: "t" + strconv.FormatInt(prefixes.Add(1), 10), Clock: mc})
	})
}

// TestSharedAcrossStores: two stores (two instances) on one Redis share a
// caller's bucket and an IP's window, on Redis TIME.
func TestSharedAcrossStores(t *testing.T) {
	rs := testenv.StartRedis(t)
	a := redisquota.New(client(t, rs.URL()), redisquota.Config{})
	b := redisquota.New(client(t, rs.URL()), redisquota.Config{})
	r := quota.Request{IP: "198.51.100.1", PerIP: quota.Window{Limit: 1000, Length: time.Hour},
		Caller: "key:shared", Plan: bucket.Limit{Rate: 1.0 / 3600, Burst: 6}, Cost: 1}
	allowed := 0
	for i := range 10 {
		s := a
		if i%2 == 1 {
			s = b
		}
		res, err := s.Check(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if res.Plan.Allowed {
			allowed++
		}
		if res.IP.Count != float64(i) {
			t.Fatalf("request %d: the IP window counted %v before it", i, res.IP.Count)
		}
	}
	if allowed != 6 {
		t.Fatalf("%d allowed across two stores, want the burst of 6", allowed)
	}
}

// TestRedisAway: with Redis stopped the store's error wraps
// bucket.ErrUnavailable (what quota.Failover falls back on).
func TestRedisAway(t *testing.T) {
	rs := testenv.StartRedis(t)
	s := redisquota.New(client(t, rs.URL()), redisquota.Config{Timeout: 200 * time.Millisecond})
	rs.Stop(t)
	_, err := s.Check(context.Background(), quota.Request{Caller: "key:a", Plan: bucket.Limit{Rate: 1, Burst: 1}, Cost: 1})
	if !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("%v, want ErrUnavailable", err)
	}
}
