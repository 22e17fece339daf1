package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
)

// drainInflight is max_inflight of the throughput lanes.
const drainInflight = 64

// drainPayload is the body of prefilled jobs.
var drainPayload = []byte(`{"event":"bench.drain","customer":"c-0001","amount":4200,"ok":1}`)

// runDrain: how fast one lane drains a prefilled backlog into the local
// sink, at a rate too high to limit it, against a raw JetStream fetch+ack
// loop over an identical stream on the same server (memory pacer, and Redis
// pacer when Redis is there); the same drain with OpenTelemetry tracing on
// against off (tracing.go); and the Redis calls per drained job at 1,000
// jobs/s.
func runDrain(ctx context.Context, e *env) ([]Result, error) {
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	n := 50_000
	if e.cfg.Smoke {
		n = 500
	}
	var rows []Result
	row, err := e.drainThroughput(ctx, sk, "", "memory pacer", n)
	if err != nil {
		return nil, err
	}
	rows = append(rows, row)
	// A tracing row that fails (a dropped span under load) must not take
	// the rows after it along: its error is reported once the others ran.
	var tracingErr error
	for _, every := range []int{1, 10} {
		row, err = e.drainTracing(ctx, sk, n, every)
		if err != nil {
			tracingErr = errors.Join(tracingErr, err)
			continue
		}
		rows = append(rows, row)
	}
	if row, err = e.drainDest(ctx, sk, n); err != nil {
		return rows, errors.Join(tracingErr, err)
	}
	rows = append(rows, row)

	url, skip, err := e.redis()
	if err != nil {
		return rows, errors.Join(tracingErr, err)
	}
	callsName := "drain @1,000/s, Redis pacer: Redis calls per drained job"
	if skip != "" {
		rows = append(rows, skipRow(Drain, "drain, 1 lane → sink: jobs/s, Redis pacer (vs raw fetch+ack)", "≥ 0.50×", skip),
			skipRow(Drain, callsName, "≤ 0.10 at ≥ 1,000/s", skip))
		return rows, tracingErr
	}
	row, err = e.drainThroughput(ctx, sk, url, "Redis pacer", n)
	if err != nil {
		return rows, errors.Join(tracingErr, err)
	}
	rows = append(rows, row)
	row, err = e.drainCalls(ctx, sk, url, callsName)
	if err != nil {
		return rows, errors.Join(tracingErr, err)
	}
	return append(rows, row), tracingErr
}

func (e *env) drainThroughput(ctx context.Context, sk *sink, redisURL, pacer string, n int) (Result, error) {
	name := fmt.Sprintf("drain, 1 lane → sink: jobs/s, %s (vs fetch, POST, ack)", pacer)
	ours, ref := e.lane("drain"), e.lane("drainref")
	lo := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: drainInflight, backlog: int64(4 * n)}
	// The reference lane is configured only so that the service sets up its
	// stream and consumer exactly like ours; it is dropped before the
	// service that drains ours starts.
	cfg, err := e.serviceConfig(svcOpts{dataDir: e.dir("drain"), redisURL: redisURL, target: sk.URL,
		lanes: map[string]laneOpts{ours: lo, ref: lo}})
	if err != nil {
		return Result{}, err
	}
	// Both backlogs go in before anything drains; the references run on the
	// same server (same data directory, same stream settings, pulls of the
	// drain's batch size, 64 = max_inflight at this rate) before the
	// service starts again.
	var refRate, rawRate float64
	err = e.prefill(ctx, cfg, map[string]int{ours: 2 * n, ref: n}, drainPayload, func(js jetstream.JetStream) error {
		var err error
		if refRate, err = e.fetchPostAck(ctx, js, ref, sk.URL, drainInflight, n); err != nil {
			return err
		}
		// The cost of the POSTs alone: pull, ack, no delivery, on a
		// backlog of the same size (drained by ours below otherwise).
		rawRate, err = e.fetchAck(ctx, js, ours, drainInflight, n)
		return err
	})
	if err != nil {
		return Result{}, err
	}
	cfg.Lanes = slices.DeleteFunc(cfg.Lanes, func(l config.Lane) bool { return l.Name == ref })
	sk.reset(n)
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	werr := sk.wait(ctx, n, 2*e.dur+time.Duration(n)*time.Millisecond, e.prog, "drain "+pacer)
	calls := svc.counter("throttler_pacer_calls_total", map[string]string{"lane": ours})
	svc.stop()
	if werr != nil {
		return Result{}, werr
	}
	arrivals, _ := sk.snapshot()
	p := pacingOf(arrivals, 0)
	return Result{
		ID: Drain, Scenario: name,
		Ours: fmt.Sprintf("%s (%s jobs, max_inflight %d, %.3f pacer calls/job)", fmtRate(p.Achieved), fmtInt(int64(n)),
			drainInflight, calls/float64(n)),
		Reference: fmtRate(refRate),
		Ratio:     fmtRatio(p.Achieved, refRate),
		Goal:      "≥ 0.80×",
		Verdict:   verdict(p.Achieved >= 0.8*refRate),
		Note: fmt.Sprintf("the reference pulls %d at a time, POSTs each job to the same sink (at most %d at once) and acks it after the answer, without pacing; pull and ack alone (no POST) make %s",
			drainInflight, drainInflight, fmtRate(rawRate)),
	}, nil
}

// fetchAck drains n messages of lane with plain pull fetches of batch and
// an ack each, and returns messages/s from the first message to the last.
func (e *env) fetchAck(ctx context.Context, js jetstream.JetStream, lane string, batch, n int) (float64, error) {
	cons, err := js.Consumer(ctx, queue.StreamName(lane), queue.ConsumerName)
	if err != nil {
		return 0, fmt.Errorf("bench: reference consumer: %w", err)
	}
	deadline := time.Now().Add(2*e.dur + time.Duration(n)*time.Millisecond)
	var first, last time.Time
	got := 0
	for got < n {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("bench: reference fetch+ack: %d of %d messages before the deadline", got, n)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		// Never ask for more than is left: the last pull would wait out
		// its expiry.
		b, err := cons.Fetch(min(batch, n-got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return 0, fmt.Errorf("bench: reference fetch: %w", err)
		}
		for m := range b.Messages() {
			if first.IsZero() {
				first = time.Now()
			}
			if err := m.Ack(); err != nil {
				return 0, fmt.Errorf("bench: reference ack: %w", err)
			}
			got++
		}
		if got%(batch*16) < batch {
			e.prog.set("raw fetch+ack", got, n)
		}
	}
	last = time.Now()
	return rate(n-1, last.Sub(first)), nil
}

// fetchPostAck is the reference drain: the same work as ours without
// pacing. It pulls n messages of lane in pulls of at most inflight, POSTs
// each to url (at most inflight at once, one keep-alive connection each)
// and acks it when the answer came, and returns jobs/s from the first
// message to the last answer.
func (e *env) fetchPostAck(ctx context.Context, js jetstream.JetStream, lane, url string, inflight, n int) (float64, error) {
	cons, err := js.Consumer(ctx, queue.StreamName(lane), queue.ConsumerName)
	if err != nil {
		return 0, fmt.Errorf("bench: reference consumer: %w", err)
	}
	client := newClient(inflight)
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 2*e.dur+time.Duration(n)*time.Millisecond)
	defer cancel()
	sem := make(chan struct{}, inflight)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		done     atomic.Int64
	)
	var first time.Time
	got := 0
	for got < n && ctx.Err() == nil {
		// Ask for what may be in flight at most: MaxAckPending bounds it.
		b, err := cons.Fetch(min(inflight, n-got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return 0, fmt.Errorf("bench: reference fetch: %w", err)
		}
		for m := range b.Messages() {
			if first.IsZero() {
				first = time.Now()
			}
			got++
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				// Out of time: no place was taken, so no delivery may
				// start (it would wait forever to give one back).
				_ = m.Nak()
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := post(ctx, client, url, m.Data(), 200); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					_ = m.Nak()
					return
				}
				if err := m.Ack(); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
				}
				if d := done.Add(1); d%1024 == 0 {
					e.prog.set("reference fetch, POST, ack", int(d), n)
				}
			})
		}
	}
	wg.Wait()
	last := time.Now()
	if firstErr != nil {
		return 0, fmt.Errorf("bench: reference fetch, POST, ack: %w", firstErr)
	}
	if err := ctx.Err(); err != nil || done.Load() < int64(n) {
		return 0, fmt.Errorf("bench: reference fetch, POST, ack: %d of %d before the deadline", done.Load(), n)
	}
	return rate(n-1, last.Sub(first)), nil
}

// drainCalls runs a lane at 1,000 jobs/s on the Redis pacer and counts the
// lane state calls per drained job.
func (e *env) drainCalls(ctx context.Context, sk *sink, redisURL, name string) (Result, error) {
	const perSecond = 1000
	n := int(perSecond * e.dur.Seconds())
	n = max(n, 100)
	lane := e.lane("calls")
	lo := laneOpts{rate: perSecond, burst: 1, inflight: config.DefaultMaxInflight, backlog: int64(4 * n)}
	cfg, err := e.serviceConfig(svcOpts{dataDir: e.dir("calls"), redisURL: redisURL, target: sk.URL, lanes: map[string]laneOpts{lane: lo}})
	if err != nil {
		return Result{}, err
	}
	if err := e.prefill(ctx, cfg, map[string]int{lane: n}, drainPayload, nil); err != nil {
		return Result{}, err
	}
	sk.reset(n)
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	werr := sk.wait(ctx, n, 2*time.Duration(n)*time.Second/perSecond+10*time.Second, e.prog, "drain @1,000/s")
	calls := svc.counter("throttler_pacer_calls_total", map[string]string{"lane": lane})
	svc.stop()
	if werr != nil {
		return Result{}, werr
	}
	arrivals, _ := sk.snapshot()
	p := pacingOf(arrivals, time.Second/perSecond)
	perJob := calls / float64(n)
	return Result{
		ID: Drain, Scenario: name,
		Ours: fmt.Sprintf("%.3f (%s calls / %s jobs at %s, max_inflight %d)", perJob, fmtInt(int64(calls)), fmtInt(int64(n)),
			fmtRate(p.Achieved), config.DefaultMaxInflight),
		Reference: "—",
		Ratio:     "—",
		Goal:      "≤ 0.10 at ≥ 1,000/s",
		Verdict:   verdict(perJob <= 0.1 && p.Achieved >= 0.99*perSecond),
	}, nil
}
