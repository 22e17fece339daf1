package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// Tests of several real throttler processes (the built binary) sharing one
// redis-server and one nats-server: the limit is one limit across the
// fleet, and Redis going away pauses the fleet without breaking it.

// cluster starts n `throttler serve` processes on one in-process
// nats-server and one redis-server, all with one lane "demo" at l, and a
// target that records arrivals.
type cluster struct {
	redis  *testenv.Redis
	target *arrivals
	procs  []*proc
}

// addrs lists the instances' HTTP addresses.
func (c *cluster) addrs() []string {
	out := make([]string, len(c.procs))
	for i, p := range c.procs {
		out[i] = p.addr
	}
	return out
}

func startCluster(t *testing.T, n int, l bucket.Limit, maxInflight int) *cluster {
	t.Helper()
	natsURL := testenv.StartNATS(t).ClientURL()
	c := &cluster{redis: testenv.StartRedis(t), target: newArrivals(t)}
	dir := t.TempDir()
	for range n {
		path, addr := procConfig(t, dir, natsURL, c.redis.URL(), laneYAML{rate: l.Rate, burst: l.Burst, maxInflight: maxInflight, target: c.target.srv.URL})
		c.procs = append(c.procs, startProc(t, path, addr))
	}
	return c
}

// arrivalTimes returns a copy of the arrival times, in arrival order.
func (a *arrivals) arrivalTimes() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.at)
}

// postJobs submits the ids round-robin to the addresses from workers
// goroutines and returns the answers' states by id; any status but 202
// fails t.
func postJobs(t *testing.T, addrs, ids []string, workers int) map[string]string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var (
		mu     sync.Mutex
		states = map[string]string{}
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Value
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ids) {
					return
				}
				code, state := postState(client, addrs[i%len(addrs)], ids[i])
				if code != http.StatusAccepted {
					failed.CompareAndSwap(nil, fmt.Sprintf("job %s to %s: status %d", ids[i], addrs[i%len(addrs)], code))
					return
				}
				mu.Lock()
				states[ids[i]] = state
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		t.Fatal(msg)
	}
	return states
}

// postState submits one job and returns the status and the answer's state.
func postState(client *http.Client, addr, id string) (int, string) {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", strings.NewReader(`{"job":"`+id+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var a struct {
		State string `json:"state"`
	}
	body, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(body, &a)
	if a.State == "" {
		a.State = string(body)
	}
	return resp.StatusCode, a.State
}

// metric reads one sample from a process's /metrics: name is the family,
// labels the exact label set as it appears ({lane="demo",op="reserve"}).
// It returns -1 when the sample is absent or /metrics does not answer.
func metric(addr, name, labels string) float64 {
	v, err := servicetest.Value(addr, name+labels)
	if err != nil {
		return -1
	}
	return v
}

// maxInWindow is the largest number of arrivals in a window [a_i, a_i + w)
// that starts at an arrival, and where the first such window starts.
func maxInWindow(at []time.Time, w time.Duration) (int, time.Time) {
	s := slices.Clone(at)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	best, where := 0, time.Time{}
	j := 0
	for i := range s {
		for j < len(s) && s[j].Sub(s[i]) < w {
			j++
		}
		if j-i > best {
			best, where = j-i, s[i]
		}
	}
	return best, where
}

// g1Tolerance widens the windows of the G1 check on arrivals: a start is
// less than one period after its slot's theoretical time (a later one is
// given up, see leaky.Config.MaxLate), which keeps windows of whole periods
// exact and others within one start, and reaches the target a few ms after
// that across processes sharing two CPUs.
func g1Tolerance(l bucket.Limit) time.Duration {
	return max(leaky.DefaultMaxLate, l.Period()) + 10*time.Millisecond
}

// checkG1 fails t when some window [a_i, a_j] holds more arrivals than
// burst + rate·(W + tol), for W up to maxW; tol absorbs the jitter between a
// dispatch's start and its arrival at the target.
func checkG1(t *testing.T, at []time.Time, l bucket.Limit, maxW, tol time.Duration) {
	t.Helper()
	s := slices.Clone(at)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	for i := range s {
		for j := i; j < len(s) && s[j].Sub(s[i]) <= maxW; j++ {
			w := s[j].Sub(s[i]) + tol
			if allowed := float64(l.Burst) + l.Rate*w.Seconds(); float64(j-i+1) > allowed+1e-9 {
				t.Fatalf("G1 broken: %d arrivals within %v (arrivals %d..%d), limit %v allows %.2f with %v of jitter",
					j-i+1, s[j].Sub(s[i]), i, j, l, allowed, tol)
			}
		}
	}
}

// TestThreeInstancesShareOneLimit is the fleet promise: three throttler
// processes on one Redis and one JetStream, a lane at 50/s burst 5, 500
// jobs posted round-robin to the three. Every job reaches the one target
// exactly once; no second holds more than burst + rate = 55 arrivals, nor
// any window up to 2 s more than burst + rate·W; the drain takes the ideal
// (500−5)/50 = 9.9 s within 3 %; and Redis calls per job are logged
// (informational; BenchmarkDrainRedisCalls measures them). 500 jobs are
// ten 1-s windows of steady drain, each 2-s window many times over, and
// the 3 % is of the drain's length, whatever it is.
func TestThreeInstancesShareOneLimit(t *testing.T) {
	l := bucket.Limit{Rate: 50, Burst: 5}
	const jobs = 500
	c := startCluster(t, 3, l, 16)
	addrs := c.addrs()
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("fleet-%04d", i)
	}
	posted := time.Now()
	states := postJobs(t, addrs, ids, 8)
	admitted := 0
	for _, s := range states {
		if s == "admitted" {
			admitted++
		}
	}
	took := time.Since(posted)
	t.Logf("posted %d jobs in %v: %d admitted, %d queued", jobs, took.Round(time.Millisecond), admitted, jobs-admitted)
	// Admission and the drains share the bucket: the burst, plus a token
	// that refilled before a drain reserved it.
	if limit := float64(l.Burst) + l.Rate*took.Seconds(); float64(admitted) > limit {
		t.Fatalf("%d jobs admitted across the fleet while posting for %v, over the limit's %.0f", admitted, took, limit)
	}

	ideal := time.Duration(float64(jobs-l.Burst) / l.Rate * float64(time.Second))
	poll(t, ideal+20*time.Second, "every job delivered", func() bool { return len(c.target.perID()) == jobs })
	settled(t, c.addrs()[0])
	for id, n := range c.target.perID() {
		if n != 1 {
			t.Errorf("job %s delivered %d times, want once", id, n)
		}
	}
	at := c.target.arrivalTimes()
	if len(at) != jobs {
		t.Fatalf("%d arrivals for %d jobs", len(at), jobs)
	}

	most, where := maxInWindow(at, time.Second)
	t.Logf("busiest 1-s window: %d arrivals (from %v after the first)", most, where.Sub(at[0]).Round(time.Millisecond))
	if limit := l.Burst + int(l.Rate); most > limit {
		t.Errorf("%d arrivals in one second, over burst + rate = %d", most, limit)
	}
	// The strict form of G1, for every window up to 2 s, with 10 ms for the
	// jitter between a start and its arrival across three processes.
	checkG1(t, at, l, 2*time.Second, g1Tolerance(l))

	span := at[len(at)-1].Sub(at[0])
	t.Logf("drain: %v from the first arrival to the last, ideal %v (%+.2f%%)", span.Round(time.Millisecond), ideal, 100*(span.Seconds()/ideal.Seconds()-1))
	if dev := span.Seconds()/ideal.Seconds() - 1; dev < -0.03 || dev > 0.03 {
		t.Errorf("drain took %v, want %v within 3%%", span, ideal)
	}

	var reserves, admits, slots float64
	for _, p := range c.procs {
		reserves += max(0, metric(p.addr, "throttler_pacer_calls_total", `{lane="demo",op="reserve"}`))
		admits += max(0, metric(p.addr, "throttler_pacer_calls_total", `{lane="demo",op="admit"}`))
		slots += max(0, metric(p.addr, "throttler_slots_reserved_total", `{lane="demo"}`))
	}
	t.Logf("Redis calls (informational: BenchmarkDrainRedisCalls measures them): %.0f reserve (%.0f slots) + %.0f admit for %d jobs: %.2f calls per job", reserves, slots, admits, jobs, (reserves+admits)/jobs)
}

// TestRedisOutageMidDrain stops redis-server for 3 s in the middle of a
// drain shared by three instances, then starts it again (empty, on the same
// port). While it is away: submissions are answered 202 "queued" (never a
// 5xx), nothing is dispatched without a slot, throttler_pacer_up is 0 and
// the log says the drain paused. Within 2 s of its return the drain resumes
// by itself, the metric is 1 and the log says so. Nothing is lost, nothing is
// delivered twice, and no window holds more than the limit.
//
// 220 jobs: about 100 before the outage, and a backlog of about 135 that takes
// some 2.5 s after it (a few more start between the count and the stop),
// longer than the longest window checked (2 s), so that the
// windows from the resume on are all full ones.
func TestRedisOutageMidDrain(t *testing.T) {
	l := bucket.Limit{Rate: 50, Burst: 5}
	const jobs, during = 220, 15
	c := startCluster(t, 3, l, 16)
	addrs := c.addrs()
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("out-%03d", i)
	}
	postJobs(t, addrs, ids, 6)
	poll(t, 10*time.Second, "100 deliveries", func() bool { return c.target.count() >= 100 })

	stopped := time.Now()
	c.redis.Stop(t)
	pacerUp := func(want float64) func() bool {
		return func() bool {
			for _, p := range c.procs {
				if metric(p.addr, "throttler_pacer_up", `{lane="demo"}`) != want {
					return false
				}
			}
			return true
		}
	}
	poll(t, 2*time.Second, "throttler_pacer_up 0 on every instance", pacerUp(0))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := range during {
		id := fmt.Sprintf("out-during-%02d", i)
		code, state := postState(client, addrs[i%len(addrs)], id)
		if code != http.StatusAccepted || state != "queued" {
			t.Fatalf("submission while Redis is away: %d %q, want 202 queued", code, state)
		}
		ids = append(ids, id)
	}
	// The outage lasts 3 s: a duration under test, not a wait for a condition.
	time.Sleep(time.Until(stopped.Add(3 * time.Second)))
	inOutage := c.target.count()
	c.redis.Start(t)
	restarted := time.Now()
	poll(t, 2*time.Second, "throttler_pacer_up 1 on every instance within 2 s of Redis returning", pacerUp(1))
	poll(t, 2*time.Second, "a delivery within 2 s of Redis returning", func() bool { return c.target.count() > inOutage })

	poll(t, 20*time.Second, "every job delivered", func() bool { return len(c.target.perID()) == len(ids) })
	settled(t, c.addrs()[0])
	got := c.target.perID()
	dups := 0
	for _, id := range ids {
		switch n := got[id]; {
		case n == 0:
			t.Errorf("job %s lost", id)
		case n > 1:
			dups += n - 1
			t.Errorf("job %s delivered %d times (an ack lost?)", id, n)
		}
	}

	at := c.target.arrivalTimes()
	// Slots reserved before the stop may still start just after it; after
	// that, nothing starts until Redis is back.
	var firstAfter time.Time
	for _, a := range at {
		if a.After(stopped.Add(500*time.Millisecond)) && a.Before(restarted) {
			t.Errorf("a job arrived %v into the outage: dispatched without a slot", a.Sub(stopped).Round(time.Millisecond))
		}
		if a.After(restarted) && (firstAfter.IsZero() || a.Before(firstAfter)) {
			firstAfter = a
		}
	}
	t.Logf("outage %v; first arrival %v after Redis returned; %d jobs, %d duplicates",
		restarted.Sub(stopped).Round(time.Millisecond), firstAfter.Sub(restarted).Round(time.Millisecond), len(ids), dups)
	if most, _ := maxInWindow(at, time.Second); most > l.Burst+int(l.Rate) {
		t.Errorf("%d arrivals in one second, over burst + rate", most)
	}
	checkG1(t, at, l, 2*time.Second, g1Tolerance(l))

	for _, p := range c.procs {
		logs := p.logs.String()
		if !strings.Contains(logs, "pacer unavailable, drain paused") || !strings.Contains(logs, "pacer is back, drain resumes") {
			t.Errorf("instance %s did not log the pause and the resume:\n%s", p.addr, tail(logs, 30))
		}
	}
}
