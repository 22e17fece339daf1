package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/worker"
)

// span is one job's run on a worker.
type span struct {
	id         string
	start, end time.Time
}

// TestPullPoolStaysBusy is the goal of pull mode: three single-threaded
// workers (200 ms a job) behind a lane with max_inflight 3, drained by two
// throttler instances sharing Redis, never run more than 3 jobs at once
// and are at least 2.7 of 3 busy on average while work waits (the best of
// up to three runs of 60 jobs; the bound is checked in every run). (Request/
// reply to a queue group of the same workers reached about 1.8: NATS picks
// a random member, so jobs queue on a busy one while another idles.)
func TestPullPoolStaysBusy(t *testing.T) {
	const (
		workers = 3
		perJob  = 200 * time.Millisecond
		jobs    = 60
	)
	f := newFleet(t, 2, "50/s", workers, nil)
	var (
		mu          sync.Mutex
		spans       []span
		running     atomic.Int64
		peak        atomic.Int64
		ranTwiceIDs []string
		seen        = map[string]bool{}
	)
	for i := range workers {
		nc := f.conn(t)
		runPool(t, nc, worker.Config{Subject: workSubject, Name: "w" + string(rune('a'+i))},
			func(ctx context.Context, job *worker.Job) error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				s := span{id: job.ID, start: time.Now()}
				time.Sleep(perJob) // single-threaded work
				s.end = time.Now()
				running.Add(-1)
				mu.Lock()
				if seen[job.ID] {
					ranTwiceIDs = append(ranTwiceIDs, job.ID)
				}
				seen[job.ID] = true
				spans = append(spans, s)
				mu.Unlock()
				return nil
			})
	}
	// A loaded machine (two cores shared by many) can starve the test for
	// a whole run: the best of up to three runs must reach the goal, and
	// every run must keep the bound.
	best := 0.0
	for run := 1; run <= 3 && best < 2.7 && !(raceEnabled && run > 1); run++ {
		mu.Lock()
		spans, seen = nil, map[string]bool{}
		mu.Unlock()
		f.submit(t, fmt.Sprintf("busy%d", run), jobs)
		waitFor(t, 60*time.Second, "every job done", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) == jobs
		})
		mu.Lock()
		avg, steady := busyShare(t, spans, perJob)
		mu.Unlock()
		t.Logf("run %d: pool busy %.2f of %d on average over %v (peak %d at once)", run, avg, workers, steady.Round(time.Millisecond), peak.Load())
		best = max(best, avg)
		if p := peak.Load(); p > workers {
			t.Fatalf("%d jobs ran at once; max_inflight is %d", p, workers)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ranTwiceIDs) > 0 {
		t.Errorf("jobs run twice without a failure: %v", ranTwiceIDs)
	}
	switch {
	case raceEnabled:
		// The race detector's instrumentation, not the hand-over, bounds
		// the busy share here; the bound of 3 at once was still checked.
		t.Logf("race detector on: busy share reported, not checked")
	case best < 2.7:
		t.Fatalf("pool busy at best %.2f of %d on average while work waited; want at least 2.7", best, workers)
	}
}

// busyShare is how many workers were busy on average over the steady part
// of a run: from one job length after the first start (every worker has
// asked by then) to the last start (the queue is empty after it).
func busyShare(t *testing.T, spans []span, perJob time.Duration) (float64, time.Duration) {
	t.Helper()
	first, lastStart := spans[0].start, spans[0].start
	for _, s := range spans {
		if s.start.Before(first) {
			first = s.start
		}
		if s.start.After(lastStart) {
			lastStart = s.start
		}
	}
	from, to := first.Add(perJob), lastStart
	if to.Sub(from) < 2*time.Second {
		t.Fatalf("steady part of %v: too short to measure", to.Sub(from))
	}
	var busy time.Duration
	for _, s := range spans {
		a, b := max(s.start.UnixNano(), from.UnixNano()), min(s.end.UnixNano(), to.UnixNano())
		if b > a {
			busy += time.Duration(b - a)
		}
	}
	return float64(busy) / float64(to.Sub(from)), to.Sub(from)
}

// TestLeaseExpiryRetries: a worker that takes a job and vanishes without a
// word loses it when its lease runs out; the job is retried (attempt 2) by
// another worker, and the first worker's late report is refused.
func TestLeaseExpiryRetries(t *testing.T) {
	// Not parallel: its lower bound on the lease is timed from after the
	// hand-out returned, which a stall of a loaded process would shorten.
	const lease = 700 * time.Millisecond
	f := newFleet(t, 1, "20/s", 3, func(l *config.Lane) {
		l.Target.NATS.Lease = config.Duration(lease)
		l.Retry = config.Retry{MaxAttempts: 3, BackoffBase: config.Duration(10 * time.Millisecond), BackoffMax: config.Duration(20 * time.Millisecond)}
	})
	gone, other := newRawWorker(t, f), newRawWorker(t, f)
	f.submit(t, "lease", 1)
	job := gone.pull(10 * time.Second)
	taken := time.Now()
	if got := job.Header.Get(worker.HeaderAttempt); got != "1" {
		t.Fatalf("first hand-out is attempt %q", got)
	}
	if got := job.Header.Get(worker.HeaderLease); got != "700" {
		t.Fatalf("%s: %q, want 700", worker.HeaderLease, got)
	}
	again := other.pull(10 * time.Second)
	waited := time.Since(taken)
	if id := again.Header.Get(worker.HeaderIdempotencyKey); id != "lease-000" {
		t.Fatalf("the second worker got %q", id)
	}
	if got := again.Header.Get(worker.HeaderAttempt); got != "2" {
		t.Fatalf("retry after a lost lease is attempt %q, want 2", got)
	}
	if waited < lease-50*time.Millisecond {
		t.Fatalf("job taken back after %v, before its %v lease ran out", waited, lease)
	}
	t.Logf("job taken back and handed out again %v after the first hand-out (lease %v)", waited.Round(time.Millisecond), lease)
	if r := gone.report(job.Reply, worker.StatusDone, ""); r.Header.Get(worker.HeaderStatus) != worker.StatusRefused {
		t.Fatalf("a report on an expired lease was %q, want refused", r.Header.Get(worker.HeaderStatus))
	}
	if r := other.report(again.Reply, worker.StatusDone, "lease-000"); r.Header.Get(worker.HeaderStatus) != worker.StatusAccepted {
		t.Fatalf("the holder's report: %q %q", r.Header.Get(worker.HeaderStatus), r.Header.Get(worker.HeaderError))
	}
	if n := len(f.deadLetters(t)); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// TestProgressExtendsTheLease: a worker that reports progress keeps its job
// past the lease; nobody else gets it. The reports come every fifth of the
// lease, so that a stall of the loaded machine shorter than four fifths of
// it (800 ms) does not let the lease run out between two of them.
func TestProgressExtendsTheLease(t *testing.T) {
	const lease = time.Second
	f := newFleet(t, 1, "20/s", 3, func(l *config.Lane) { l.Target.NATS.Lease = config.Duration(lease) })
	holder, other := newRawWorker(t, f), newRawWorker(t, f)
	f.submit(t, "prog", 1)
	job := holder.pull(10 * time.Second)
	// Waiting through all the reports below.
	other.ask(4 * time.Second)
	for range 12 { // 12 × 200 ms: well past the lease
		time.Sleep(lease / 5)
		if r := holder.report(job.Reply, worker.StatusProgress, ""); r.Header.Get(worker.HeaderStatus) != worker.StatusAccepted {
			t.Fatalf("progress report: %q %q", r.Header.Get(worker.HeaderStatus), r.Header.Get(worker.HeaderError))
		}
	}
	if r := holder.report(job.Reply, worker.StatusDone, ""); r.Header.Get(worker.HeaderStatus) != worker.StatusAccepted {
		t.Fatalf("done report: %q", r.Header.Get(worker.HeaderStatus))
	}
	if m := other.next(5 * time.Second); m.Header.Get(worker.HeaderStatus) != worker.StatusEmpty {
		t.Fatalf("another worker got %q while the holder reported progress", m.Header.Get(worker.HeaderIdempotencyKey))
	}
}

// TestFailuresDeadLetter: Dead(err) dead-letters a job at once with the
// worker's reason; a plain error retries it until retry.max_attempts, then
// dead-letters it; RetryAfter waits at least its delay.
func TestFailuresDeadLetter(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1, "50/s", 2, func(l *config.Lane) {
		l.Retry = config.Retry{MaxAttempts: 2, BackoffBase: config.Duration(10 * time.Millisecond), BackoffMax: config.Duration(20 * time.Millisecond)}
	})
	var mu sync.Mutex
	tries := map[string][]time.Time{}
	runPool(t, f.conn(t), worker.Config{Subject: workSubject, Concurrency: 2}, func(_ context.Context, job *worker.Job) error {
		mu.Lock()
		tries[job.ID] = append(tries[job.ID], time.Now())
		n := len(tries[job.ID])
		mu.Unlock()
		switch job.ID {
		case "fail-000":
			return worker.Dead(errors.New("payload is not an order"))
		case "fail-001":
			return errors.New("database down")
		case "fail-002":
			if n == 1 {
				return worker.RetryAfter(time.Second, errors.New("busy"))
			}
		}
		return nil
	})
	f.submit(t, "fail", 4)
	waitFor(t, 20*time.Second, "two dead letters and the other jobs done", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(f.deadLetters(t)) == 2 && len(tries["fail-002"]) == 2 && len(tries["fail-003"]) == 1
	})
	byID := map[string]string{}
	for _, d := range f.deadLetters(t) {
		byID[d.ID] = d.Reason + " | " + d.LastError
		if d.ID == "fail-001" && d.Attempts != 2 {
			t.Errorf("fail-001 dead after %d attempts, want 2", d.Attempts)
		}
	}
	if got := byID["fail-000"]; !strings.Contains(got, "rejected by target") || !strings.Contains(got, "payload is not an order") {
		t.Errorf("fail-000 dead letter: %q", got)
	}
	if got := byID["fail-001"]; !strings.Contains(got, "failed 2 attempts") || !strings.Contains(got, "database down") {
		t.Errorf("fail-001 dead letter: %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := len(tries["fail-000"]); n != 1 {
		t.Errorf("fail-000 tried %d times after Dead", n)
	}
	if gap := tries["fail-002"][1].Sub(tries["fail-002"][0]); gap < 950*time.Millisecond {
		t.Errorf("fail-002 tried again %v after RetryAfter(1s)", gap)
	}
}

// TestGracefulStopHandsBack: a stopping pool finishes the job it runs and
// reports it done; jobs that reach it after the stop began go back at once
// (attempt 1, long before the lease), and another pool runs them.
func TestGracefulStopHandsBack(t *testing.T) {
	t.Parallel()
	const lease = 20 * time.Second
	f := newFleet(t, 1, "50/s", 4, func(l *config.Lane) { l.Target.NATS.Lease = config.Duration(lease) })
	var mu sync.Mutex
	ran := map[string][]string{} // id → pool:attempt
	record := func(pool string, job *worker.Job) {
		mu.Lock()
		ran[job.ID] = append(ran[job.ID], pool+":"+job.Header.Get(worker.HeaderAttempt))
		mu.Unlock()
	}
	started := make(chan struct{})
	var once sync.Once
	stop1 := runPool(t, f.conn(t), worker.Config{Subject: workSubject, Concurrency: 3, Name: "first"}, func(_ context.Context, job *worker.Job) error {
		once.Do(func() { close(started) })
		time.Sleep(400 * time.Millisecond)
		record("first", job)
		return nil
	})
	f.submit(t, "g1", 1)
	<-started
	stopped := make(chan struct{})
	go func() { stop1(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Run returned while a job was still running")
	case <-time.After(100 * time.Millisecond):
	}
	<-stopped
	mu.Lock()
	if got := ran["g1-000"]; len(got) != 1 {
		t.Fatalf("the running job: %v", got)
	}
	mu.Unlock()
	// The stopped pool's pull requests may still wait at the throttler:
	// jobs handed to them come back at once (the server answers for the
	// gone inbox), not after the 20 s lease.
	f.submit(t, "g2", 3)
	time.Sleep(300 * time.Millisecond)
	began := time.Now()
	runPool(t, f.conn(t), worker.Config{Subject: workSubject, Concurrency: 2, Name: "second"}, func(_ context.Context, job *worker.Job) error {
		record("second", job)
		return nil
	})
	waitFor(t, 5*time.Second, "the second pool to run the jobs the first one was handed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 4
	})
	t.Logf("handed-back jobs done %v after the second pool started", time.Since(began).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	for id, runs := range ran {
		if len(runs) != 1 {
			t.Errorf("%s ran %v", id, runs)
		}
		if strings.HasPrefix(id, "g2-") && runs[0] != "second:1" {
			t.Errorf("%s ran %v, want once by the second pool as attempt 1", id, runs)
		}
	}
}

// TestForeignReportRefused: outcomes are bound to the lease they were
// handed with. A worker cannot settle another worker's job, neither by
// guessing its outcome subject nor by naming its job id on its own lease;
// the holder's report still settles it.
func TestForeignReportRefused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1, "50/s", 3, nil)
	a, b := newRawWorker(t, f), newRawWorker(t, f)
	f.submit(t, "own", 2)
	ja, jb := a.pull(10*time.Second), b.pull(10*time.Second)
	idA := ja.Header.Get(worker.HeaderIdempotencyKey)
	if ja.Reply == "" || ja.Reply != ja.Header.Get(worker.HeaderAck) {
		t.Fatalf("reply subject %q and %s %q differ", ja.Reply, worker.HeaderAck, ja.Header.Get(worker.HeaderAck))
	}
	// b knows a's job id (say from the payload) and the subject layout,
	// not a's token.
	prefix := jb.Reply[:strings.LastIndexByte(jb.Reply, '.')]
	for _, subject := range []string{prefix + "." + idA, prefix + ".0000000000000000"} {
		m := b.report(subject, worker.StatusDead, idA)
		if m.Header.Get(worker.HeaderStatus) != worker.StatusRefused {
			t.Fatalf("report on %s: %q, want refused", subject, m.Header.Get(worker.HeaderStatus))
		}
	}
	// A holder that does not exist: nobody listens.
	if m, err := b.tryReport(workSubject+".ack.x."+idA, worker.StatusDead, idA); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("report to an unknown holder: %v %v", m, err)
	}
	if m := b.report(jb.Reply, worker.StatusDone, idA); m.Header.Get(worker.HeaderStatus) != worker.StatusRefused ||
		!strings.Contains(m.Header.Get(worker.HeaderError), "not \""+idA+"\"") {
		t.Fatalf("report on b's lease naming a's job: %q %q", m.Header.Get(worker.HeaderStatus), m.Header.Get(worker.HeaderError))
	}
	if m := b.report(jb.Reply, "finished", ""); m.Header.Get(worker.HeaderStatus) != worker.StatusRefused {
		t.Fatalf("unknown status: %q", m.Header.Get(worker.HeaderStatus))
	}
	for _, w := range []struct {
		w *rawWorker
		m string
	}{{a, ja.Reply}, {b, jb.Reply}} {
		if m := w.w.report(w.m, worker.StatusDone, ""); m.Header.Get(worker.HeaderStatus) != worker.StatusAccepted {
			t.Fatalf("the holder's report: %q %q", m.Header.Get(worker.HeaderStatus), m.Header.Get(worker.HeaderError))
		}
	}
	if m := a.report(ja.Reply, worker.StatusDone, ""); m.Header.Get(worker.HeaderStatus) != worker.StatusRefused {
		t.Fatalf("a second report on a settled lease: %q", m.Header.Get(worker.HeaderStatus))
	}
	if n := len(f.deadLetters(t)); n != 0 {
		t.Fatalf("%d dead letters: a refused report settled a job", n)
	}
}
