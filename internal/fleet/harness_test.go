package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/testenv"
)

// The tests that check G1's windows at the target (leader kill, Sentinel
// failover, Redis Cluster, Redis restarted empty) run one at a time: each
// measures the stalls of the process while it runs (testenv.StallMeter) and widens
// its window check by three times the worst, and a sibling's clusters
// starting and failing over beside it would stall the process enough that
// a double grant (a whole burst) fits in the allowance. The tests that
// check outcomes only (two deployments, a fleet started at once) run in
// parallel after them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

// arrival is one request at the target: the job id (Idempotency-Key), the
// lane (the target's path) and when it came.
type arrival struct {
	id, lane string
	at       time.Time
}

// target is an HTTP target that records every arrival and answers 200,
// with the stall meter of the test that owns it.
type target struct {
	srv    *httptest.Server
	stalls *testenv.StallMeter
	mu     sync.Mutex
	got    []arrival
}

func newTarget(t *testing.T) *target {
	t.Helper()
	tg := &target{stalls: testenv.StartStallMeter(t)}
	tg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		tg.mu.Lock()
		tg.got = append(tg.got, arrival{id: r.Header.Get("Idempotency-Key"), lane: strings.TrimPrefix(r.URL.Path, "/"), at: at})
		tg.mu.Unlock()
	}))
	t.Cleanup(tg.srv.Close)
	return tg
}

// URL is where a lane delivers: the target, path /<lane>.
func (tg *target) URL(lane string) string { return tg.srv.URL + "/" + lane }

func (tg *target) arrivals() []arrival {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return slices.Clone(tg.got)
}

// distinct counts the distinct ids that arrived.
func (tg *target) distinct() int {
	seen := map[string]bool{}
	for _, a := range tg.arrivals() {
		seen[a.id] = true
	}
	return len(seen)
}

// startInstance runs a throttler instance with the configuration y until
// the test ends; its log goes to the test's output when the test fails.
func startInstance(t *testing.T, name, y string) *service.Service {
	t.Helper()
	cfg, err := config.Parse(name+".yaml", []byte(y), nil)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, y)
	}
	logs := &testenv.LogBuffer{}
	svc := service.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("instance", name), nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, logs.String())
		}
	})
	select {
	case <-svc.Ready():
	case err := <-errc:
		errc <- err
		t.Fatalf("%s did not start: %v\n%s", name, err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready after 30s\n%s", name, logs.String())
	}
	return svc
}

// startFleet starts n instances, i0, i1, …, with the nats and redis
// sections given (flow mappings such as {url: "…", mode: sentinel}),
// dispatching to loopback targets only, draining lanes (the list items of
// the lanes section).
func startFleet(t *testing.T, n int, nats, redis, lanes string) []*service.Service {
	t.Helper()
	svcs := make([]*service.Service, n)
	for i := range svcs {
		svcs[i] = startInstance(t, fmt.Sprintf("i%d", i), fmt.Sprintf(`listen: 127.0.0.1:0
nats: %s
redis: %s
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
%s`, nats, redis, lanes))
	}
	return svcs
}

// laneYAML is one lane entry of a configuration.
func laneYAML(name string, l bucket.Limit, url string) string {
	return fmt.Sprintf("  - name: %s\n    rate: %g\n    burst: %d\n    max_inflight: 16\n    max_bytes: 8MiB\n    target: {http: {url: %q, timeout: 5s}}\n", name, l.Rate, l.Burst, url)
}

// client submits jobs as a well-behaved client does: a 202 is the promise
// that the job will arrive; a 503 must carry Retry-After, and the same id
// is sent again after a short wait; anything else fails the test.
type client struct {
	t       *testing.T
	http    *http.Client
	addrs   []string
	mu      sync.Mutex
	ok      map[string]string // id → lane, for every 202
	unavail atomic.Int64      // 503 answers (with Retry-After)
	failed  atomic.Int64      // connection errors
}

func newClient(t *testing.T, addrs ...string) *client {
	c := &client{t: t, http: &http.Client{Timeout: 10 * time.Second}, addrs: addrs, ok: map[string]string{}}
	t.Cleanup(c.http.CloseIdleConnections)
	return c
}

// submit sends job id to lane through instance i (mod the count) until it
// is accepted or deadline passes; it reports whether it was.
func (c *client) submit(lane, id string, i int, deadline time.Time) bool {
	for try := 0; ; try++ {
		addr := c.addrs[(i+try)%len(c.addrs)]
		code, retryAfter, body := c.post(addr, lane, id)
		switch {
		case code == http.StatusAccepted:
			c.mu.Lock()
			c.ok[id] = lane
			c.mu.Unlock()
			return true
		case code == http.StatusServiceUnavailable:
			c.unavail.Add(1)
			if retryAfter == "" {
				c.t.Errorf("503 for job %s without Retry-After: %s", id, body)
			}
		case code == 0:
			c.failed.Add(1)
		default:
			c.t.Errorf("job %s to %s: status %d: %s", id, addr, code, body)
			return false
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *client) post(addr, lane, id string) (int, string, string) {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/"+lane+"/jobs", strings.NewReader(`{"job":"`+id+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
}

// accepted returns a copy of the accepted ids and their lanes.
func (c *client) accepted() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]string, len(c.ok))
	for k, v := range c.ok {
		out[k] = v
	}
	return out
}

// submitAll submits n jobs "<prefix>-<i>" to lane, round-robin over the
// instances from workers goroutines, each retried until accepted; it fails
// the test for any job not accepted within a minute.
func (c *client) submitAll(lane, prefix string, n, workers int) {
	c.t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(time.Minute)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				id := fmt.Sprintf("%s-%d", prefix, i)
				if !c.submit(lane, id, i, deadline) {
					c.t.Errorf("job %s not accepted within a minute", id)
					return
				}
			}
		})
	}
	wg.Wait()
}

// waitDelivered waits until every accepted job arrived at tg, or fails
// naming the missing ones.
func waitDelivered(t *testing.T, c *client, tg *target, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		want := c.accepted()
		seen := map[string]bool{}
		for _, a := range tg.arrivals() {
			seen[a.id] = true
		}
		var missing []string
		for id := range want {
			if !seen[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			slices.Sort(missing)
			t.Fatalf("%d of %d accepted jobs never arrived within %v: %v", len(missing), len(want), within, missing[:min(len(missing), 20)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// duplicates counts arrivals beyond the first of each id, by lane.
func duplicates(at []arrival) int {
	seen := map[string]bool{}
	n := 0
	for _, a := range at {
		if seen[a.lane+"\x00"+a.id] {
			n++
		}
		seen[a.lane+"\x00"+a.id] = true
	}
	return n
}

// checkDuplicates fails the test when a job arrived that was never
// accepted, or when more jobs arrived twice than can be in flight at once
// (16 per lane and instance). A Redis outage redelivers nothing by itself;
// a duplicate is a dispatch whose answer did not come back in time (the
// target's timeout, on a loaded machine), which at-least-once delivery
// retries with the same id.
func checkDuplicates(t *testing.T, at []arrival, c *client) {
	t.Helper()
	accepted := c.accepted()
	lanes := map[string]bool{}
	for _, a := range at {
		lanes[a.lane] = true
		if _, ok := accepted[a.id]; !ok {
			t.Errorf("job %q arrived at lane %s but was never accepted", a.id, a.lane)
			return
		}
	}
	if d := duplicates(at); d > 3*16*len(lanes) {
		t.Errorf("%d duplicate arrivals; at most %d jobs can be in flight", d, 3*16*len(lanes))
	}
}

// tolerance widens the windows of the G1 check on arrivals: a start is less
// than one period after its slot's theoretical time (windows of whole periods
// exact, others within one start), and reaches the target some milliseconds
// after that on a loaded machine.
func tolerance(l bucket.Limit) time.Duration {
	return max(leaky.DefaultMaxLate, l.Period()) + 30*time.Millisecond
}

// busiest is the largest number of arrivals of lane within w (a window
// starting at an arrival), and where it starts.
func busiest(at []arrival, lane string, w time.Duration) (int, time.Time) {
	var ts []time.Time
	for _, a := range at {
		if a.lane == lane {
			ts = append(ts, a.at)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, where, j := 0, time.Time{}, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		if j-i > best {
			best, where = j-i, ts[i]
		}
	}
	return best, where
}

// checkWindows fails the test when some window of lane's arrivals at tg,
// up to maxW long, holds more than burst + rate·(W + tol): the limit, with
// the jitter between a slot and its arrival at the target.
func (tg *target) checkWindows(t *testing.T, at []arrival, lane string, l bucket.Limit, maxW time.Duration) {
	t.Helper()
	checkWindowsTol(t, at, lane, l, maxW, tolerance(l)+3*tg.stalls.WorstStall())
}

// The worst stall of the test process (testenv.StallMeter) widens
// checkWindows's tolerance by three times: a job crosses two goroutines on
// its way (the dispatch and the target's handler), each may be held, and
// after a stall the work held back queues for a while longer than the
// stall itself (seen in TestRedisClusterHundredLanes, 300 drains in one
// process, on lanes that never paused). It judges the throttler, not the
// machine; a real double grant shows as a whole burst or more, beyond it.
// Each test has its own, from its target's start to its end: it sees the
// stalls that the tests running beside it cause too, as its arrivals do.

// checkWindowsTol is checkWindows with a given jitter tolerance.
func checkWindowsTol(t *testing.T, at []arrival, lane string, l bucket.Limit, maxW, tol time.Duration) {
	t.Helper()
	var ts []time.Time
	for _, a := range at {
		if a.lane == lane {
			ts = append(ts, a.at)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	for i := range ts {
		for j := i; j < len(ts) && ts[j].Sub(ts[i]) <= maxW; j++ {
			w := ts[j].Sub(ts[i]) + tol
			if allowed := float64(l.Burst) + l.Rate*w.Seconds(); float64(j-i+1) > allowed+1e-9 {
				t.Errorf("lane %s: %d arrivals within %v (from %v after the first), the limit %v allows %.2f with %v of jitter",
					lane, j-i+1, ts[j].Sub(ts[i]), ts[i].Sub(ts[0]).Round(time.Millisecond), l, allowed, tol)
				return
			}
		}
	}
}

// longestGap is the longest time between two consecutive arrivals of lane
// after from, and where it starts.
func longestGap(at []arrival, lane string, from time.Time) (time.Duration, time.Time) {
	var ts []time.Time
	for _, a := range at {
		if a.lane == lane && !a.at.Before(from) {
			ts = append(ts, a.at)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	var where time.Time
	prev := from
	for _, x := range ts {
		if d := x.Sub(prev); d > gap {
			gap, where = d, prev
		}
		prev = x
	}
	return gap, where
}

// waitUntil polls cond every 20 ms until it holds or within passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publishAll publishes n jobs "<prefix>-<i>" to lane's public subject on
// NATS (Nats-Msg-Id is the job id) and records each acknowledged one as
// accepted: the fast way to queue a backlog.
func (c *client) publishAll(natsURL, lane, prefix string, n int) {
	c.t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		msg := nats.NewMsg(queue.Subject(lane, ""))
		msg.Header.Set(jetstream.MsgIDHeader, id)
		msg.Data = []byte(`{"job":"` + id + `"}`)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			c.t.Fatalf("publish %s: %v", id, err)
		}
		c.mu.Lock()
		c.ok[id] = lane
		c.mu.Unlock()
	}
}
