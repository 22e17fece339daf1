package redisquota_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/admission"
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
// per-IP window and the plan bucket, layers=both+lane the same script with
// the lane's admission peek folded in (what a single job's submission
// makes), layers=lane is the lane's admission peek (redisbucket) on its
// own, on the same server, for comparison.
func BenchmarkCheck(b *testing.B) {
	_, pipe := benchRedis(b)
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
	folded := redisquota.New(pipe, redisquota.Config{Lanes: store})
	b.Run("layers=both+lane", func(b *testing.B) {
		run(b, func(ctx context.Context, i int) error {
			_, err := folded.Check(ctx, quota.Request{
				IP: "10.0.0." + strconv.Itoa(i), PerIP: quota.Window{Limit: 1_000_000_000, Length: time.Hour},
				Caller: "key:" + strconv.Itoa(i), Plan: lim, Cost: 1,
				Lane: bucket.Key{Lane: "lane-" + strconv.Itoa(i)}, LaneLimit: lim})
			return err
		})
	})
	b.Run("layers=lane", func(b *testing.B) {
		run(b, func(ctx context.Context, i int) error {
			_, err := store.Peek(ctx, bucket.Key{Lane: "lane-" + strconv.Itoa(i)}, lim)
			return err
		})
	})
}

// noBacklog is an empty lane backlog (the service caches a JetStream
// figure: it costs no call per decision).
type noBacklog struct{}

func (noBacklog) Backlog(context.Context, string, time.Duration) (int64, error) { return 0, nil }

// BenchmarkDecisionCPU: a single job's whole decision from 64 goroutines
// on the autopipeliner, lane-only (admission.Decide: the lane's peek), with
// both caller layers folded into the lane's script (one round trip), and
// with both layers in their own script before the lane's peek (two round
// trips: batches, and Redis Cluster). Besides wall time it reports the CPU
// time per decision of redis-server (INFO cpu) and of this process
// (getrusage): on a shared machine wall time moves with the neighbours'
// load, CPU time much less.
//
//	go test -run '^$' -bench DecisionCPU -benchtime 20000x ./internal/quota/redisquota/
func BenchmarkDecisionCPU(b *testing.B) {
	c, pipe := benchRedis(b)
	lim := bucket.Limit{Rate: bucket.MaxRate, Burst: bucket.MaxBurst}
	lanes := redisbucket.New(pipe, redisbucket.DefaultConfig())
	adm, err := admission.New(admission.Config{Store: lanes, Backlog: noBacklog{}})
	if err != nil {
		b.Fatal(err)
	}
	folded := redisquota.New(pipe, redisquota.Config{Lanes: lanes})
	separate := redisquota.New(pipe, redisquota.Config{})
	redisCPU := func() time.Duration {
		info, err := c.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var s float64
		for _, l := range strings.Split(info, "\r\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO cpu %s: %v", l, err)
				}
				s += f
			}
		}
		return time.Duration(s * float64(time.Second))
	}
	// scriptTime is the time redis-server spent running scripts (INFO
	// commandstats: evalsha and eval, the redis.call's inside included),
	// apart from reading requests and writing replies.
	scriptTime := func() time.Duration {
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		var us int64
		for _, l := range strings.Split(info, "\r\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok || (k != "cmdstat_evalsha" && k != "cmdstat_eval") {
				continue
			}
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "usec="); ok {
					u, err := strconv.ParseInt(n, 10, 64)
					if err != nil {
						b.Fatalf("INFO commandstats %s: %v", l, err)
					}
					us += u
				}
			}
		}
		return time.Duration(us) * time.Microsecond
	}
	selfCPU := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// Every goroutine's requests and lane are made up front, as intake
	// has them at hand: the rows compare decisions, not string building.
	workers := runtime.GOMAXPROCS(0)*max(1, 64/runtime.GOMAXPROCS(0)) + 1
	reqs, bare, lanesOf := make([]quota.Request, workers), make([]quota.Request, workers), make([]admission.Lane, workers)
	for i := range workers {
		bare[i] = quota.Request{IP: "10.0.0." + strconv.Itoa(i), PerIP: quota.Window{Limit: 1_000_000_000, Length: time.Hour},
			Caller: "key:" + strconv.Itoa(i), Plan: lim, Cost: 1}
		reqs[i] = bare[i]
		reqs[i].Lane, reqs[i].LaneLimit = bucket.Key{Lane: "lane-" + strconv.Itoa(i)}, lim
		lanesOf[i] = admission.Lane{Name: "lane-" + strconv.Itoa(i), Limit: lim, MaxBacklog: 1 << 40}
	}
	req := func(i int, lane bool) quota.Request {
		if lane {
			return reqs[i]
		}
		return bare[i]
	}
	lane := func(i int) admission.Lane { return lanesOf[i] }
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, i int) error
	}{
		{"lane-only", func(ctx context.Context, i int) error {
			_, err := adm.Decide(ctx, lane(i), "")
			return err
		}},
		{"layers-folded", func(ctx context.Context, i int) error {
			res, err := folded.Check(ctx, req(i, true))
			if err == nil && !res.LaneChecked {
				err = errors.New("the lane was not folded in")
			}
			if err != nil {
				return err
			}
			_, err = adm.DecideFrom(ctx, lane(i), admission.Peeked{D: res.Lane, At: time.Now()}, time.Now())
			return err
		}},
		{"layers-then-lane", func(ctx context.Context, i int) error {
			if _, err := separate.Check(ctx, req(i, false)); err != nil {
				return err
			}
			_, err := adm.Decide(ctx, lane(i), "")
			return err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			var next atomic.Int64 // goroutine i uses reqs[i], lanesOf[i]
			r0, s0, l0 := redisCPU(), selfCPU(), scriptTime()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1))
				for pb.Next() {
					if err := tc.op(context.Background(), i); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			r, s, l := redisCPU()-r0, selfCPU()-s0, scriptTime()-l0
			b.ReportMetric(float64(r.Microseconds())/float64(b.N), "redis-cpu-µs/op")
			b.ReportMetric(float64(l.Microseconds())/float64(b.N), "redis-script-µs/op")
			b.ReportMetric(float64(s.Microseconds())/float64(b.N), "client-cpu-µs/op")
		})
	}
}

// benchRedis starts a redis-server and returns a client with a pool for 64
// goroutines and the autopipeliner on it that the service uses.
func benchRedis(b *testing.B) (*redis.Client, *redis.AutoPipeliner) {
	b.Helper()
	rs := testenv.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: rs.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	b.Cleanup(func() { c.Close() })
	pipe, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pipe.Close() })
	return c, pipe
}
