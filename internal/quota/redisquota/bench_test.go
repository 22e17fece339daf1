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

// foldEnvelope and foldWrites cut the folded script down to what no
// version of it can do without, for BenchmarkDecisionCPU's decomposition.
// foldEnvelope is the lane's peek in the folded script's shape (three
// keys, the packed parameters, one MGET of the three, a nine-value reply)
// without the layers; foldWrites adds the two writes that every request
// both layers admit must make (the IP window's count and the caller's tat,
// SET … PX, values of the same size), still without the layers' checks.
var (
	foldEnvelope = redis.NewScript(redisbucket.PeekLua + `
return {1, 0, 0, 0, 1, 0, lane_reply()}
`)
	foldWrites = redis.NewScript(redisbucket.PeekLua + `
redis.call('SET', KEYS[2], '012345670123456701234567', 'PX', 7200000)
redis.call('SET', KEYS[3], now_us + 1, 'PX', 1)
return {1, 0, 0, 0, 1, 0, lane_reply()}
`)
	// foldMset is foldWrites with the two writes as one MSET: the floor of
	// a layout that writes both layers' states in one command (MSET sets
	// no expiry and clears one a key had).
	foldMset = redis.NewScript(redisbucket.PeekLua + `
redis.call('MSET', KEYS[2], '012345670123456701234567', KEYS[3], now_us + 1)
return {1, 0, 0, 0, 1, 0, lane_reply()}
`)
)

// BenchmarkDecisionCPU: a single job's whole decision from 64 goroutines
// on the autopipeliner, lane-only (admission.Decide: the lane's peek), with
// both caller layers folded into the lane's script (one round trip), and
// with both layers in their own script before the lane's peek (two round
// trips: batches, and Redis Cluster). Two rows between lane-only and
// layers-folded say where the folded script's cost lies: fold-envelope
// and fold-writes (foldEnvelope, foldWrites); fold-mset (foldMset) is
// fold-writes with its two writes in one command. Besides wall time it reports
// the CPU time per decision of redis-server (INFO cpu) and of this process
// (getrusage), the time redis-server spent in scripts and the commands
// the scripts called per decision (INFO commandstats): on a shared machine
// wall time moves with the neighbours' load, CPU time much less.
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
	// scripts reads INFO commandstats: the time redis-server spent running
	// scripts (evalsha and eval, the redis.call's inside included, apart
	// from reading requests and writing replies), and how many commands
	// the scripts called (Redis counts those on their own lines).
	scripts := func() (time.Duration, int64) {
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		var us, inner int64
		for _, l := range strings.Split(info, "\r\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok || !strings.HasPrefix(k, "cmdstat_") {
				continue
			}
			field := func(name string) int64 {
				for _, f := range strings.Split(v, ",") {
					if n, ok := strings.CutPrefix(f, name+"="); ok {
						u, err := strconv.ParseInt(n, 10, 64)
						if err != nil {
							b.Fatalf("INFO commandstats %s: %v", l, err)
						}
						return u
					}
				}
				b.Fatalf("INFO commandstats %s: no %s", l, name)
				return 0
			}
			switch k {
			case "cmdstat_evalsha", "cmdstat_eval":
				us += field("usec")
			case "cmdstat_info", "cmdstat_config", "cmdstat_hello", "cmdstat_client", "cmdstat_ping", "cmdstat_script":
			default:
				inner += field("calls")
			}
		}
		return time.Duration(us) * time.Microsecond, inner
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
	params := strings.Repeat("\x00", 7*8)
	// cut runs a cut-down folded script for goroutine i's request and
	// decides on its peek as layers-folded does.
	cut := func(ctx context.Context, script *redis.Script, i int) error {
		r := reqs[i]
		f, err := lanes.Fold(r.Lane, r.LaneLimit)
		if err != nil {
			return err
		}
		keys := []string{f.Key(), "thr:{callers}:ipw:" + r.IP, "thr:{callers}:c:" + r.Caller}
		reply, err := script.Run(ctx, pipe, keys, f.Args(params)...).Slice()
		if err != nil {
			return err
		}
		d, err := f.Decision(reply[6:])
		if err != nil {
			return err
		}
		_, err = adm.DecideFrom(ctx, lane(i), admission.Peeked{D: d, At: time.Now()}, time.Now())
		return err
	}
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, i int) error
	}{
		{"lane-only", func(ctx context.Context, i int) error {
			_, err := adm.Decide(ctx, lane(i), "")
			return err
		}},
		{"fold-envelope", func(ctx context.Context, i int) error { return cut(ctx, foldEnvelope, i) }},
		{"fold-writes", func(ctx context.Context, i int) error { return cut(ctx, foldWrites, i) }},
		{"fold-mset", func(ctx context.Context, i int) error { return cut(ctx, foldMset, i) }},
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
			r0, s0 := redisCPU(), selfCPU()
			l0, n0 := scripts()
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
			r, s := redisCPU()-r0, selfCPU()-s0
			l, n := scripts()
			l, n = l-l0, n-n0
			b.ReportMetric(float64(r.Microseconds())/float64(b.N), "redis-cpu-µs/op")
			b.ReportMetric(float64(l.Microseconds())/float64(b.N), "redis-script-µs/op")
			b.ReportMetric(float64(n)/float64(b.N), "redis-calls/op")
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
