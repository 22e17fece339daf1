package redisbucket_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/testenv"
)

// newAutoPipeline is the client the service gives the store: go-redis's
// autopipeliner over a fail-fast client, which sends concurrent calls as
// one pipeline.
func newAutoPipeline(t testing.TB, addr string) *redis.AutoPipeliner {
	t.Helper()
	c := newFailFastClient(t, addr)
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ap.Close() })
	return ap
}

func TestAutoPipelineConformance(t *testing.T) {
	sameCodeAsTestConformance(t)
	ap := newAutoPipeline(t, sharedRedis(t))
	buckettest.Run(t, func(t *testing.T, clock *clock.Manual) bucket.Store {
		if err := ap.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		return onClock(ap, clock)
	}, buckettest.Options{Resolution: 2 * time.Microsecond})
}

// TestAutoPipelineConcurrentExactness: many goroutines, one key, a fixed
// clock: exactly the burst is admitted, and no slot is handed out twice,
// although the calls travel in shared pipelines.
func TestAutoPipelineConcurrentExactness(t *testing.T) {
	sameCodeAsTestConformance(t)
	checkConcurrentExactness(t, onClock(newAutoPipeline(t, sharedRedis(t)), fixedClock()), bucket.Limit{Rate: 1, Burst: 100}, 32, 50, 2)
}

// TestAutoPipelineOutage: with Redis away every call fails at once with
// ErrUnavailable, and the store works again by itself when Redis is back.
func TestAutoPipelineOutage(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := redisbucket.New(newAutoPipeline(t, srv.Addr), redisbucket.DefaultConfig())
	l := bucket.Limit{Rate: 100, Burst: 10}
	if _, err := s.Admit(ctx, lane, l); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	for i := range 5 {
		start := time.Now()
		_, err := s.Reserve(ctx, lane, l, 2)
		elapsed := time.Since(start)
		t.Logf("reserve %d with Redis down: %v after %v", i, err, elapsed)
		if !errors.Is(err, bucket.ErrUnavailable) || !strings.Contains(err.Error(), "demo") {
			t.Fatalf("reserve with Redis down: %v, want ErrUnavailable naming the lane", err)
		}
		if elapsed > 250*time.Millisecond {
			t.Fatalf("reserve with Redis down took %v, want a quick failure", elapsed)
		}
	}
	srv.Start(t)
	back := time.Now()
	deadline := back.Add(5 * time.Second)
	for {
		_, err := s.Admit(ctx, lane, l)
		if err == nil {
			t.Logf("working again %v after Redis came back", time.Since(back).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing 5s after Redis came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
