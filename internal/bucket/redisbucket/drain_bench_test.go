//go:build !mutation

// Benchmarks are left out of a mutation run (build tag mutation), which
// builds the tests once per mutant and runs no benchmark.

package redisbucket_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/testenv"
)

// backlog is a leaky.Source with a deep backlog of b.N jobs.
type backlog struct {
	mu   sync.Mutex
	left int
}

type job struct{}

func (s *backlog) Next(ctx context.Context, max int) ([]job, error) {
	s.mu.Lock()
	n := min(max, s.left)
	s.left -= n
	s.mu.Unlock()
	if n == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out := make([]job, n)
	for i := range out {
		out[i] = job{}
	}
	return out, nil
}

func (s *backlog) Release(items []job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left += len(items)
}

// BenchmarkDrainRedisCalls drains b.N jobs through a real leaky.Drain whose
// slots come from the Redis store (the service's client: autopipelined,
// fail-fast), at 100, 1,000 and 10,000 jobs/s, with the default max_inflight
// (16) and one sized for a fast lane (256). The dispatch is a no-op, so the
// figures are the pacer's alone: calls/job is Redis calls per drained job
// (one call reserves BatchFor(rate, max_inflight) slots), jobs/s the
// achieved rate after the burst. ns/op is about 1/rate by construction.
//
//	go test -run '^$' -bench DrainRedisCalls -benchtime 2s ./internal/bucket/redisbucket/
func BenchmarkDrainRedisCalls(b *testing.B) {
	srv := testenv.StartRedis(b)
	ap := newAutoPipeline(b, srv.Addr)
	var run atomic.Int64
	type lane struct {
		rate               float64
		burst, maxInflight int
	}
	var lanes []lane
	for _, rate := range []float64{100, 1_000, 10_000} {
		for _, maxInflight := range []int{16, 256} {
			lanes = append(lanes, lane{rate, 10, maxInflight})
		}
	}
	// Burst 10 at 10,000/s tolerates 0.9 ms of lateness (τ): a drain that
	// comes back for its next batch later than τ + T after its last slot
	// loses the difference. 10 ms of burst hides timer and network lateness.
	lanes = append(lanes, lane{10_000, 100, 256})
	for _, ln := range lanes {
		rate, maxInflight := ln.rate, ln.maxInflight
		b.Run(fmt.Sprintf("rate=%g/burst=%d/max_inflight=%d", rate, ln.burst, maxInflight), func(b *testing.B) {
			s := redisbucket.New(ap, redisbucket.DefaultConfig())
			l := bucket.Limit{Rate: rate, Burst: ln.burst}
			k := bucket.Key{Lane: fmt.Sprintf("drain-%d", run.Add(1))}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var started int
			var first, last time.Time
			d, err := leaky.New(leaky.Config[job]{
				Source:      &backlog{left: b.N},
				Pacer:       leaky.StorePacer{Store: s, Key: k, Limit: func() bucket.Limit { return l }},
				MaxInflight: maxInflight,
				Batch:       leaky.BatchFor(rate, maxInflight),
				Start: func(_ context.Context, _ job, done func()) {
					// Only the drain's goroutine calls Start.
					last = time.Now()
					if started == 0 {
						first = last
					}
					started++
					if started == b.N {
						cancel()
					}
					done()
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			_ = d.Run(ctx)
			b.StopTimer()
			if started != b.N {
				b.Fatalf("%d of %d jobs started within a minute", started, b.N)
			}
			b.ReportMetric(float64(redisbucket.Calls(s))/float64(b.N), "calls/job")
			if b.N > 2*l.Burst {
				b.ReportMetric(float64(b.N-l.Burst)/last.Sub(first).Seconds(), "jobs/s")
			}
		})
	}
}
