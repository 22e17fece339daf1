package lane

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestHeldLaneResumedDrainsEveryJobOnce: the records bench's drain rows on
// one lane. A lane at the highest rate (bucket.MaxRate, burst 1,
// max_inflight 64), with a short ack wait (1 s), is held by an operator
// while 2,000 jobs are queued, and then resumed and held again in rounds,
// each hold lasting twice the ack wait with the drain sitting on the jobs
// it fetched. Every round brings its share of jobs well within the bound
// (10 s, an outcome bound: a round takes milliseconds), and in the end
// every job reached the target exactly once and JetStream delivered each
// exactly once (its consumer's delivery sequence is the job count).
//
// Before, a resumed lane brought nothing under the race detector (every
// slot, 1 µs wide, passed during the checks before its start: leaky
// TestChecksSlowerThanAPeriodStillStart), and jobs that the last pull
// request brought during a hold sat unread past the ack wait and were
// delivered twice (queue TestJobsOfAnOpenPullAreKeptWhileNotAsked).
func TestHeldLaneResumedDrainsEveryJobOnce(t *testing.T) {
	const (
		ackWait = time.Second
		n       = 2000
		rounds  = 3
		within  = 10 * time.Second
	)
	nc, q := laneQueue(t)
	ctx := context.Background()
	limits, err := q.EnsureLimits(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string]int{}
	total := 0
	target := dispatch.Handler(func(_ context.Context, j dispatch.Job) dispatch.Result {
		mu.Lock()
		defer mu.Unlock()
		got[j.ID]++
		total++
		return dispatch.Result{Verdict: dispatch.Done}
	})
	delivered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return total
	}
	rate, err := bucket.ParseRate(strconv.Itoa(bucket.MaxRate) + "/s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{Lanes: []config.Lane{{Name: "demo", Rate: rate, Burst: 1, MaxInflight: 64,
		AckWait: config.Duration(ackWait), Target: config.Target{Handler: "h"}}}}
	cfg.ApplyDefaults()
	l, err := New(ctx, cfg.Lanes[0], Deps{Bus: nc, Targets: NATSTargets{Conn: nc}, Queue: q, Store: &bucket.Memory{},
		Limits: limits, Handlers: map[string]dispatch.Target{"h": target}, Metrics: metrics.New(prometheus.NewRegistry()),
		DedupWindow: time.Minute, Instance: "i1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	if err := l.SetPaused(ctx, true, "test"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := q.Publish(ctx, queue.Job{ID: "j" + strconv.Itoa(i), Lane: "demo", Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	defer runLane(t, ctx, l, within)()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, queue.StreamName("demo"), queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	info := func() *jetstream.ConsumerInfo {
		t.Helper()
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}
	for r := range rounds {
		// The held drain sits on what it fetched (in hand, read ahead,
		// brought by its last pull request) for twice the ack wait; it
		// starts none of it.
		testenv.Eventually(t, within, "round "+strconv.Itoa(r)+": the held drain holding fetched jobs, none in flight", func() bool {
			return testutil.ToFloat64(l.hot.inflight) == 0 && info().NumAckPending > 0
		})
		before := delivered()
		<-time.After(2 * ackWait)
		if d := delivered(); d != before {
			t.Fatalf("round %d: %d jobs reached the target while the lane was held", r, d-before)
		}
		if err := l.SetPaused(ctx, false, "test"); err != nil {
			t.Fatal(err)
		}
		// A round asks for a tenth of the jobs; those started before the
		// hold reached the drain come on top (hundreds at this rate), so
		// the rounds leave jobs for the last resume.
		want := before + n/10
		testenv.Eventually(t, within, "round "+strconv.Itoa(r)+"'s jobs after the resume", func() bool { return delivered() >= want })
		if err := l.SetPaused(ctx, true, "test"); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d jobs had reached the target at the resume, %d at the hold", r, before, delivered())
	}
	if err := l.SetPaused(ctx, false, "test"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, within, "every job after the last resume", func() bool { return delivered() >= n })
	testenv.Eventually(t, within, "every job acked", func() bool { return info().NumAckPending == 0 })
	mu.Lock()
	for id, c := range got {
		if c != 1 {
			t.Errorf("job %s reached the target %d times", id, c)
		}
	}
	if len(got) != n || total != n {
		t.Errorf("%d deliveries of %d jobs, want %d of %d", total, len(got), n, n)
	}
	mu.Unlock()
	if ci := info(); ci.Delivered.Consumer != n || ci.NumRedelivered != 0 {
		t.Errorf("JetStream delivered %d times (%d redelivered) for %d jobs: some jobs twice", ci.Delivered.Consumer, ci.NumRedelivered, n)
	}
}

// runLane runs l until the function it returns is called, which stops it
// and waits for its Run to return, at most within.
func runLane(t *testing.T, ctx context.Context, l *Lane, within time.Duration) func() {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		l.Run(runCtx, runCtx)
	}()
	return func() {
		stop()
		select {
		case <-ran:
		case <-time.After(within):
			t.Errorf("the lane still ran %v after it was stopped", within)
		}
	}
}
