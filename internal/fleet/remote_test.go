package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/throttler/throttler/internal/backend"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/testenv"
)

// latencyProxy puts an in-process toxiproxy in front of the Redis at addr,
// delaying every byte by each in both directions (a round trip of 2·each
// on top of loopback's), and returns the address to dial instead. It stops
// when tb ends.
func latencyProxy(tb testing.TB, addr string, each time.Duration) string {
	tb.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", addr)
	if err := p.Start(); err != nil {
		tb.Fatalf("toxiproxy: %v", err)
	}
	tb.Cleanup(p.Stop)
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"type": "latency", "stream": %q, "attributes": {"latency": %d}}`, stream, each.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			tb.Fatalf("toxiproxy %s latency: %v", stream, err)
		}
	}
	return p.Listen
}

// remoteBacklog is the queue the three drains share: n jobs, handed out up
// to max at a time, given back on Release.
type remoteBacklog struct {
	left atomic.Int64
}

func (b *remoteBacklog) Next(ctx context.Context, max int) ([]int, error) {
	for {
		left := b.left.Load()
		if left <= 0 {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		take := min(left, int64(max))
		if b.left.CompareAndSwap(left, left-take) {
			return make([]int, take), nil
		}
	}
}

func (b *remoteBacklog) Release(items []int) { b.left.Add(int64(len(items))) }

// remoteRun is what drainFar measured: the start times, sorted, as the
// target (the drains' Start) saw them, and the slots the drains gave up.
type remoteRun struct {
	starts []time.Time
	missed uint64
	// stalls are the moments the test process was held off the CPU
	// for longer than the lane's period while the drains ran.
	stalls []stall
}

// stall is a span [from, to) in which a goroutine that asked to sleep
// 100 µs did not run.
type stall struct{ from, to time.Time }

// meterStalls records, until ctx ends, each span of more than over in
// which this process did not run a goroutine sleeping 100 µs at a time:
// a start stamped in such a span was stamped late by the machine, not by
// the drain (which checked the slot's deadline right before).
func meterStalls(ctx context.Context, over time.Duration) func() []stall {
	var (
		mu  sync.Mutex
		out []stall
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		const nap = 100 * time.Microsecond
		for ctx.Err() == nil {
			before := time.Now()
			time.Sleep(nap)
			if now := time.Now(); now.Sub(before)-nap > over {
				mu.Lock()
				out = append(out, stall{from: before.Add(nap), to: now})
				mu.Unlock()
			}
		}
	}()
	return func() []stall {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

// stalledDuring returns the longest stall that overlaps [from, to].
func stalledDuring(stalls []stall, from, to time.Time) time.Duration {
	var worst time.Duration
	for _, s := range stalls {
		if s.from.After(to) || s.to.Before(from) {
			continue
		}
		worst = max(worst, s.to.Sub(s.from))
	}
	return worst
}

// drainFar drains a backlog of n jobs of one lane limited to l with three
// drains, each wired as an instance wires its lane (backend.OpenRedis's
// autopipelined client, redisbucket, leaky with leaky.BatchFor) and each
// with its own connections to Redis at addr. max_inflight is 256, as a lane
// at these rates needs (rate × a delivery's time: 5,000/s × 20 ms is 100).
// Start is the target: it notes when each job starts.
func drainFar(tb testing.TB, addr string, l bucket.Limit, n int) remoteRun {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lane := bucket.Key{Lane: fmt.Sprintf("far-%d", remoteLanes.Add(1))}
	src := &remoteBacklog{}
	src.left.Store(int64(n))
	var mu sync.Mutex
	starts := make([]time.Time, 0, n)
	start := func(_ context.Context, _ int, done func()) {
		at := time.Now()
		mu.Lock()
		starts = append(starts, at)
		if len(starts) == n {
			cancel()
		}
		mu.Unlock()
		done()
	}
	stalls := meterStalls(ctx, l.Period())
	const maxInflight = 256
	drains := make([]*leaky.Drain[int], 3)
	for i := range drains {
		r, err := backend.OpenRedis(ctx, config.Redis{URL: "redis://" + addr + "/0"}, slog.New(slog.DiscardHandler))
		if err != nil {
			tb.Fatal(err)
		}
		defer r.Close()
		store := redisbucket.New(r.Pipe, redisbucket.DefaultConfig())
		drains[i], err = leaky.New(leaky.Config[int]{
			Source:      src,
			Pacer:       leaky.StorePacer{Store: store, Key: lane, Limit: func() bucket.Limit { return l }},
			Start:       start,
			MaxInflight: maxInflight,
			Batch:       leaky.BatchFor(l.Rate, maxInflight),
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for _, d := range drains {
		wg.Go(func() { _ = d.Run(ctx) })
	}
	wg.Wait()
	cancel()
	held := stalls()
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != n {
		tb.Fatalf("%d of %d jobs started within a minute", len(starts), n)
	}
	run := remoteRun{starts: slices.Clone(starts), stalls: held}
	slices.SortFunc(run.starts, func(a, b time.Time) int { return a.Compare(b) })
	for _, d := range drains {
		run.missed += d.Missed()
	}

	return run
}

var remoteLanes atomic.Int64

// worstWholeWindow is the window of whole periods [s, s + m·T] (closed, s a
// start, m up to maxM) whose count exceeds burst + m the most, with its
// count and bound. G1 holds exactly on the start times when excess ≤ 0.
func worstWholeWindow(starts []time.Time, l bucket.Limit, maxM int) (excess, got, allowed int, at time.Duration) {
	period := l.Period()
	excess = -1 << 30
	for i := range starts {
		j := i
		for m := 1; m <= maxM; m++ {
			end := starts[i].Add(time.Duration(m) * period)
			for j < len(starts) && !starts[j].After(end) {
				j++
			}
			if ex := (j - i) - (l.Burst + m); ex > excess {
				excess, got, allowed, at = ex, j-i, l.Burst+m, starts[i].Sub(starts[0])
			}
		}
	}
	return excess, got, allowed, at
}

// TestRemoteRedisKeepsG1Exact: three instances drain one lane through a
// Redis 1 ms and 3 ms away (toxiproxy, each way), at 1,000/s burst 1 and
// 5,000/s burst 5, max_inflight 256. Every window of whole periods (up to
// a second) that begins at a start holds at most burst + rate·W starts,
// counted on the start times themselves with no tolerance, on every run;
// and the lane drains at 97 % of its rate or more (the best of up to three
// runs, as TestRealClockTenThousandPerSecond in internal/leaky: a machine
// that takes the CPU away for more than a period makes the drains give up,
// and count, the slots they woke too late for; then the rate counting those
// must reach 97 % and the rate itself 80 %).
//
// The store decides each slot at its own now; an instance hears of it a
// return leg later, and that leg differs from call to call and between
// instances. Before the drain placed its slots on the store's time line
// (Reservation.At) and topped them up a round trip ahead, each reservation's
// slots started one return leg late and a top-up held every start due
// during its round trip: windows held up to 12 starts more than the limit,
// and the lanes drained at 83–92 %.
func TestRemoteRedisKeepsG1Exact(t *testing.T) {
	redis := testenv.StartRedis(t)
	for _, each := range []time.Duration{time.Millisecond, 3 * time.Millisecond} {
		addr := latencyProxy(t, redis.Addr, each)
		for _, l := range []bucket.Limit{{Rate: 1000, Burst: 1}, {Rate: 5000, Burst: 5}} {
			t.Run(fmt.Sprintf("%v each way/%v", each, l), func(t *testing.T) {
				n := int(3 * l.Rate) // three seconds
				best, paced := 0.0, 0.0
				for try := 1; try <= 3 && best < 0.97*l.Rate && !(raceEnabled && try > 1); try++ {
					run := drainFar(t, addr, l, n)
					span := run.starts[n-1].Sub(run.starts[0])
					rate := float64(n-l.Burst) / span.Seconds()
					if rate > best {
						best, paced = rate, float64(n-l.Burst+int(run.missed))/span.Seconds()
					}
					excess, got, allowed, at := worstWholeWindow(run.starts, l, int(l.Rate))
					t.Logf("run %d: %d jobs in %v: %.0f jobs/s (%.1f %% of %v), %d slots given up; busiest window of whole periods: %d starts where G1 allows %d",
						try, n, span.Round(time.Millisecond), rate, 100*rate/l.Rate, l, run.missed, got, allowed)
					if excess > 0 {
						// A start is stamped by Start, after the drain
						// checked its slot's deadline: a stall of the
						// process between the two stamps it late, and a
						// window may then hold it beside starts it was
						// a period or more before. Such a window is the
						// machine's; any other is the pacer's.
						from := run.starts[0].Add(at)
						to := from.Add(time.Duration(allowed-l.Burst) * l.Period())
						if held := stalledDuring(run.stalls, from.Add(-l.Period()), to); held > 0 {
							t.Logf("run %d: %d starts in a window of %d periods from %v after the first, where %v allows %d, with the test process held off the CPU for %v within it: stamped late by the machine, not judged",
								try, got, allowed-l.Burst, at, l, allowed, held.Round(time.Microsecond))
						} else {
							t.Errorf("G1 broken: %d starts in a window of %d periods from %v after the first, where %v allows %d (no stall of the process over a period within it)",
								got, allowed-l.Burst, at, l, allowed)
						}
					}
				}
				switch {
				case raceEnabled:
					// The race detector's instrumentation, not the pacer,
					// bounds the rate here; G1 was still checked.
					t.Logf("race detector on: rate %.0f jobs/s reported, not checked", best)
				case best >= 0.97*l.Rate:
				case paced >= 0.97*l.Rate && best >= 0.80*l.Rate:
					t.Logf("best of three runs %.0f jobs/s; %.0f jobs/s counting the slots given up to stalls of the machine", best, paced)
				default:
					t.Errorf("best of three runs %.0f jobs/s (%.0f counting the slots given up), want %v within 3 %% (or within 20 %% with the slots given up making up the rest)", best, paced, l.Rate)
				}
			})
		}
	}
}

// BenchmarkRemoteRedisPacing: three instances drain b.N jobs of one lane
// as TestRemoteRedisKeepsG1Exact does, with Redis on loopback and 1 ms
// away each way; it reports the rate reached, the pacing (|gap − period|
// between consecutive starts, p50 and p99, in µs) and the slots given up
// per job. Starts are timed at the drains' Start, without a delivery.
//
//	go test -run '^$' -bench RemoteRedisPacing -benchtime 10000x ./internal/fleet/
func BenchmarkRemoteRedisPacing(b *testing.B) {
	redis := testenv.StartRedis(b)
	for _, each := range []time.Duration{0, time.Millisecond} {
		addr := redis.Addr
		if each > 0 {
			addr = latencyProxy(b, redis.Addr, each)
		}
		for _, l := range []bucket.Limit{{Rate: 1000, Burst: 1}, {Rate: 5000, Burst: 5}} {
			b.Run(fmt.Sprintf("redis_away=%v/rate=%g/burst=%d", each, l.Rate, l.Burst), func(b *testing.B) {
				n := max(b.N, 2*l.Burst+2)
				run := drainFar(b, addr, l, n)
				b.StopTimer()
				steady := run.starts[l.Burst:] // after the bucket's burst
				offs := make([]time.Duration, 0, len(steady))
				for i := 1; i < len(steady); i++ {
					off := steady[i].Sub(steady[i-1]) - l.Period()
					offs = append(offs, max(off, -off))
				}
				slices.Sort(offs)
				span := run.starts[n-1].Sub(run.starts[0])
				b.ReportMetric(float64(n-l.Burst)/span.Seconds(), "jobs/s")
				b.ReportMetric(float64(offs[len(offs)/2].Microseconds()), "gap-p50-µs")
				b.ReportMetric(float64(offs[len(offs)*99/100].Microseconds()), "gap-p99-µs")
				b.ReportMetric(float64(run.missed)/float64(n), "missed/job")
			})
		}
	}
}
