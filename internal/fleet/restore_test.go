package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// metricSum reads one sample family without labels (or the sum over its
// label sets) from an instance's /metrics; -1 when absent.
func metricSum(addr, name string) float64 {
	m, _, err := servicetest.TryScrape(addr, "")
	if err != nil {
		return -1
	}
	sum, found := m.Sum(name)
	if !found {
		return -1
	}
	return sum
}

func addrs(svcs []*service.Service) []string {
	out := make([]string, len(svcs))
	for i, s := range svcs {
		out[i] = s.Addr()
	}
	return out
}

// TestRedisRestartedEmptyStaysExact: three instances drain one lane at 50/s
// burst 5 through one Redis without persistence, which is killed and started
// empty twice mid-drain, then flushed ten times. The first call after each restart restores the
// lane's state from its floor, past the slots the two other live instances
// may hold (the instance registry's), so no window at the target holds
// more than burst + rate·W, and every accepted job arrives.
func TestRedisRestartedEmptyStaysExact(t *testing.T) {
	l := bucket.Limit{Rate: 50, Burst: 5}
	const jobs = 600
	natsURL := testenv.StartNATS(t).ClientURL()
	rs := testenv.StartRedis(t)
	tg := newTarget(t)
	svcs := startFleet(t, 3, fmt.Sprintf("{url: %q}", natsURL), fmt.Sprintf("{url: %q}", rs.URL()), laneYAML("demo", l, tg.URL("demo")))
	c := newClient(t, addrs(svcs)...)
	c.submitAll("demo", "r", jobs, 6)

	restoredSum := func() float64 {
		sum := 0.0
		for _, s := range svcs {
			sum += max(metricSum(s.Addr(), "throttler_pacer_states_restored_total"), 0)
		}
		return sum
	}
	// Two restarts, and ten FLUSHALLs: losses without an outage, which the
	// next call always finds with the lane's tat still ahead. After a
	// restart it may not be: the fleet held off for the outage, and when
	// that outlasts tat − now (about 0.1 s here) the bucket truly refilled
	// and a fresh state is the exact one.
	var restarts []time.Time
	for n, after := range []int{120, 270, 420} {
		waitUntil(t, 30*time.Second, fmt.Sprintf("%d arrivals", after), func() bool { return len(tg.arrivals()) >= after })
		restarts = append(restarts, time.Now())
		if n < 2 {
			rs.Stop(t)
			rs.Start(t)
			continue
		}
		// Ten losses 300 ms apart: each would grant again the slots the
		// other two instances hold (two), which adds up past the jitter
		// tolerance in the windows that span them.
		before := restoredSum()
		for range 10 {
			if _, err := testenv.RedisDo(rs.Addr, "FLUSHALL"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
		}
		waitUntil(t, 10*time.Second, "the lane state restored after FLUSHALL", func() bool { return restoredSum() >= before+5 })
	}
	waitDelivered(t, c, tg, 40*time.Second)

	at := tg.arrivals()
	tg.checkWindows(t, at, "demo", l, time.Hour) // every window, also those spanning the losses
	busy, where := busiest(at, "demo", time.Second)
	restored := restoredSum()
	gap, gapAt := longestGap(at, "demo", restarts[0])
	t.Logf("%d jobs, %d arrivals, %d duplicates; busiest 1-s window %d (limit %g, %v after the first restart); "+
		"states restored %g (across the instances); longest pause after a loss %v (at %v after the first)",
		jobs, len(at), duplicates(at), busy, l.Rate+float64(l.Burst), where.Sub(restarts[0]).Round(time.Millisecond), restored,
		gap.Round(time.Millisecond), gapAt.Sub(restarts[0]).Round(time.Millisecond))
	checkDuplicates(t, at, c)
}
