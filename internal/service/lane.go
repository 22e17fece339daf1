package service

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
)

type laneDeps struct {
	cfg         config.Lane
	handlers    map[string]dispatch.Target
	replicas    int
	nc          *nats.Conn
	dedup       time.Duration
	queue       *queue.Queue
	store       bucket.Store
	guard       *dispatch.Guard
	metrics     *metrics.Metrics
	log         *slog.Logger
	dispatchCtx context.Context
}

// lane is one lane at runtime: its stream consumer, drain and target.
type lane struct {
	laneDeps
	limit    atomic.Pointer[bucket.Limit]
	target   dispatch.Target
	closeTgt func()
	consumer *queue.Consumer
	drain    *leaky.Drain
	backoff  dispatch.Backoff

	delivered atomic.Uint64
	aimd      *leaky.AIMD // nil unless adaptive.enabled
	rateGauge prometheus.Gauge
	control   *nats.Subscription

	mu        sync.Mutex
	pacerDown bool
	pauseTill time.Time
}

// controlSubject carries a lane's pause and slow-down decisions to every
// instance (core NATS, outside the lane streams' throttle.> space).
func controlSubject(lane string) string { return "throttler.control." + lane }

func newLane(ctx context.Context, d laneDeps) (*lane, error) {
	l := &lane{laneDeps: d, backoff: dispatch.Backoff{Base: d.cfg.Retry.BackoffBase.D(), Max: d.cfg.Retry.BackoffMax.D()}}
	lim := bucket.Limit{Rate: d.cfg.Rate.PerSecond(), Burst: d.cfg.Burst}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	l.limit.Store(&lim)

	if err := l.openTarget(ctx); err != nil {
		return nil, err
	}
	l.rateGauge = d.metrics.EffectiveRate.WithLabelValues(d.cfg.Name)
	l.rateGauge.Set(lim.Rate)
	d.metrics.PausedSeconds.WithLabelValues(d.cfg.Name).Set(0)
	if a := d.cfg.Adaptive; a.Enabled {
		l.aimd = &leaky.AIMD{Decrease: a.Decrease, Increase: a.Increase, Min: a.Min, Interval: a.Interval.D()}
	}
	sub, err := d.nc.Subscribe(controlSubject(d.cfg.Name), l.onControl)
	if err != nil {
		return nil, fmt.Errorf("control subscription: %w", err)
	}
	l.control = sub

	batch := leaky.BatchFor(lim.Rate, d.cfg.MaxInflight)
	if err := d.queue.EnsureLane(ctx, queue.LaneSpec{
		Name: d.cfg.Name, MaxBacklog: d.cfg.MaxBacklog, MaxInflight: d.cfg.MaxInflight, Prefetch: batch,
		AckWait: d.cfg.AckWait.D(), MaxBody: int64(d.cfg.MaxBody), MaxBytes: int64(d.cfg.MaxBytes), DedupWindow: d.dedup, Replicas: d.replicas,
	}); err != nil {
		return nil, err
	}
	if l.consumer, err = d.queue.Consumer(d.cfg.Name); err != nil {
		return nil, err
	}
	l.drain, err = leaky.New(leaky.Config{
		Source:      l.consumer,
		Pacer:       leaky.StorePacer{Store: d.store, Key: bucket.Key{Lane: d.cfg.Name}, Limit: l.effectiveLimit},
		PausedUntil: l.pausedUntil,
		Start:       l.start,
		MaxInflight: d.cfg.MaxInflight,
		Batch:       batch,
		Logger:      d.log,
		Observer:    (*laneObserver)(l),
	})
	if err != nil {
		return nil, err
	}
	d.metrics.PacerUp.WithLabelValues(d.cfg.Name).Set(1)
	d.metrics.WatchMissed(d.cfg.Name, l.drain.Missed)
	return l, nil
}

// openTarget builds the lane's target from its config.
func (l *lane) openTarget(ctx context.Context) error {
	switch t := l.cfg.Target; {
	case t.HTTP != nil:
		h := t.HTTP
		if err := l.guard.CheckURL(ctx, h.URL); err != nil {
			return fmt.Errorf("target.http.url: %w", err)
		}
		hc := dispatch.HTTPConfig{URL: h.URL, Method: h.Method, Headers: h.Headers, Timeout: h.Timeout.D(), RetryOther4xx: h.RetryOther4xx}
		if len(h.SigningSecrets) > 0 {
			signer, err := dispatch.NewSigner(h.SigningSecrets, time.Now)
			if err != nil {
				return fmt.Errorf("target.http.signing_secrets: %w", err)
			}
			hc.Signing = signer
		}
		tgt, err := dispatch.NewHTTP(hc, l.guard)
		if err != nil {
			return fmt.Errorf("target.http: %w", err)
		}
		l.target, l.closeTgt = tgt, tgt.Close
	case t.NATS != nil:
		tgt, err := dispatch.NewNATS(l.nc, dispatch.NATSConfig{Subject: t.NATS.Subject, Timeout: t.NATS.Timeout.D(), JetStream: t.NATS.JetStream})
		if err != nil {
			return fmt.Errorf("target.nats: %w", err)
		}
		l.target = tgt
	case t.Handler != "":
		h, ok := l.handlers[t.Handler]
		if !ok {
			return fmt.Errorf("target.handler: no handler %q is registered (service.Handle)", t.Handler)
		}
		l.target = h
	default:
		return errNoTarget
	}
	return nil
}

func (l *lane) run(ctx context.Context) {
	keepCtx, stopKeep := context.WithCancel(context.WithoutCancel(ctx))
	var helpers sync.WaitGroup
	helpers.Add(2)
	go func() { defer helpers.Done(); l.consumer.KeepAlive(keepCtx) }()
	go func() { defer helpers.Done(); l.queue.MoveRetries(ctx, l.cfg.Name, l.log) }()
	_ = l.drain.Run(ctx)
	l.consumer.Close()
	stopKeep()
	helpers.Wait()
}

func (l *lane) close() {
	if l.control != nil {
		_ = l.control.Unsubscribe()
	}
	if l.closeTgt != nil {
		l.closeTgt()
	}
}

// start is the drain's Starter: it delivers the job on its own goroutine and
// settles the message by the verdict.
func (l *lane) start(_ context.Context, it leaky.Item, done func()) {
	msg := it.(*queue.Msg) // the drain only holds what the queue consumer gave it
	l.metrics.Inflight.WithLabelValues(l.cfg.Name).Inc()
	go func() {
		defer done()
		defer l.metrics.Inflight.WithLabelValues(l.cfg.Name).Dec()
		job := msg.Job()
		res := l.target.Deliver(l.dispatchCtx, dispatch.Job{
			ID: job.ID, Lane: job.Lane, Key: job.Key, ContentType: job.ContentType, Payload: job.Payload,
			Attempt: msg.Attempt(), EnqueuedAt: msg.EnqueuedAt(),
		})
		l.metrics.DispatchSeconds.WithLabelValues(l.cfg.Name).Observe(res.Took.Seconds())
		l.metrics.Dispatched.WithLabelValues(l.cfg.Name, res.Verdict.String()).Inc()
		if res.PauseLane > 0 {
			l.pause(res.PauseLane)
		}
		l.settle(msg, res)
	}()
}

// settle acks, retries or dead-letters the message by the delivery's result.
// A rate-limit answer (429, or 503 with a wait) puts the job back in its
// place without counting an attempt; other failures count, and the last
// allowed attempt's failure dead-letters the job.
func (l *lane) settle(msg *queue.Msg, res dispatch.Result) {
	job := msg.Job()
	// Settling must outlive a cancelled dispatch context: the job has to go
	// somewhere.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.dispatchCtx), 5*time.Second)
	defer cancel()
	log := l.log.With("id", job.ID, "attempt", msg.Attempt(), "status", res.Status, "err", errString(res.Err))
	switch {
	case res.Verdict == dispatch.Done:
		l.delivered.Add(1)
		if err := msg.Ack(); err != nil {
			log.Warn("ack failed; the job may be delivered again", "ack_err", err)
		}
	case l.dispatchCtx.Err() != nil:
		// Cancelled by shutdown, not the target's fault.
		_ = msg.Release()
	case res.Verdict == dispatch.Retry && rateLimited(res):
		l.slowDown()
		wait := max(res.RetryAfter, res.PauseLane, time.Second)
		log.Info("target rate-limited the job; it waits without using an attempt", "wait", wait.String())
		_ = msg.Wait(wait)
	case res.Verdict == dispatch.Retry && msg.Attempt() < l.cfg.Retry.MaxAttempts:
		delay := res.RetryAfter
		if delay <= 0 {
			delay = l.backoff.Delay(msg.Attempt(), rand.Float64)
		}
		log.Warn("delivery failed, retrying later", "retry_in", delay.String())
		if err := msg.Retry(ctx, delay); err != nil {
			log.Warn("requeue failed; the job waits in place", "requeue_err", err)
		}
	default:
		reason := "rejected by target"
		if res.Verdict == dispatch.Retry {
			reason = fmt.Sprintf("failed %d attempts", msg.Attempt())
		}
		l.metrics.DeadLettered.WithLabelValues(l.cfg.Name).Inc()
		log.Error("job dead-lettered", "reason", reason)
		if err := msg.Dead(ctx, queue.DeadInfo{Reason: reason, LastStatus: res.Status, LastError: errString(res.Err)}, l.cfg.Retry.BackoffMax.D()); err != nil {
			log.Error("dead-lettering failed; the job will be retried", "dead_err", err)
		}
	}
}

// rateLimited reports an answer that asks the lane to slow down rather
// than saying the job failed.
func rateLimited(res dispatch.Result) bool {
	return res.Status == http.StatusTooManyRequests || (res.Status == http.StatusServiceUnavailable && res.PauseLane > 0)
}

// redactURL drops credentials and the query (often an API key) from a URL
// that is shown to API clients.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = "…"
	}
	return u.String()
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// effectiveLimit is the configured limit, slowed down by AIMD when it is on.
func (l *lane) effectiveLimit() bucket.Limit {
	lim := *l.limit.Load()
	if l.aimd != nil {
		lim.Rate *= l.aimd.Factor(time.Now())
	}
	l.rateGauge.Set(lim.Rate)
	return lim
}

func (l *lane) pausedUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pauseTill
}

// holdUntil records a pause locally; it never shortens one.
func (l *lane) holdUntil(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if until.After(l.pauseTill) {
		l.pauseTill = until
	}
}

// control messages: "pause <ms>", "factor <f>" or "limit <rate> <burst>".
func (l *lane) onControl(m *nats.Msg) {
	var ms int64
	var f float64
	var lim bucket.Limit
	if n, err := fmt.Sscanf(string(m.Data), "limit %g %d", &lim.Rate, &lim.Burst); err == nil && n == 2 {
		if lim.Validate() == nil {
			l.limit.Store(&lim)
			l.log.Info("lane limit changed", "rate", lim.Rate, "burst", lim.Burst)
		}
		return
	}
	switch {
	case scan(string(m.Data), "pause %d", &ms):
		l.holdUntil(time.Now().Add(time.Duration(ms) * time.Millisecond))
	case scan(string(m.Data), "factor %g", &f) && l.aimd != nil:
		l.aimd.Adopt(f, time.Now())
	}
}

func scan(s, format string, arg any) bool {
	n, err := fmt.Sscanf(s, format, arg)
	return err == nil && n == 1
}

// setLimit changes the lane's limit here at once and on every other instance
// through the control subject. It lasts until the instances restart.
func (l *lane) setLimit(lim bucket.Limit) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	l.limit.Store(&lim)
	if err := l.nc.Publish(controlSubject(l.cfg.Name), fmt.Appendf(nil, "limit %g %d", lim.Rate, lim.Burst)); err != nil {
		return fmt.Errorf("telling the other instances: %w", err)
	}
	return nil
}

// pause holds every dispatch of the lane for d on every instance: the shared
// state is pushed past the pause (no slot is granted inside it) and a control
// message makes every drain give up the slots it already holds.
func (l *lane) pause(d time.Duration) {
	l.metrics.LanePaused.WithLabelValues(l.cfg.Name).Inc()
	l.holdUntil(time.Now().Add(d))
	l.metrics.PausedSeconds.WithLabelValues(l.cfg.Name).Set(d.Seconds())
	time.AfterFunc(d, func() { l.metrics.PausedSeconds.WithLabelValues(l.cfg.Name).Set(0) })
	_ = l.nc.Publish(controlSubject(l.cfg.Name), fmt.Appendf(nil, "pause %d", d.Milliseconds()))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.dispatchCtx), time.Second)
	defer cancel()
	if err := l.store.Pause(ctx, bucket.Key{Lane: l.cfg.Name}, l.effectiveLimit(), d); err != nil {
		l.log.Warn("pausing the lane in the shared state failed", "for", d.String(), "err", err)
		return
	}
	l.log.Info("downstream asked the lane to wait", "for", d.String())
}

// slowDown applies AIMD's decrease for a rate-limit answer and tells the
// other instances.
func (l *lane) slowDown() {
	if l.aimd == nil {
		return
	}
	f, changed := l.aimd.Limited(time.Now())
	if !changed {
		return
	}
	_ = l.nc.Publish(controlSubject(l.cfg.Name), fmt.Appendf(nil, "factor %g", f))
	l.log.Info("target rate-limited the lane; slowing down", "rate", l.cfg.Rate.PerSecond()*f)
}

func (l *lane) intake() ingest.Lane {
	return ingest.Lane{
		Admission: admission.Lane{Name: l.cfg.Name, Limit: l.effectiveLimit(), MaxBacklog: l.cfg.MaxBacklog, MaxWait: l.cfg.MaxWait.D()},
		MaxBody:   int64(l.cfg.MaxBody),
	}
}

func (l *lane) status(ctx context.Context) ingest.LaneStatus {
	lim := l.effectiveLimit()
	st := ingest.LaneStatus{
		Name: l.cfg.Name, Rate: l.limit.Load().Rate, EffectiveRate: lim.Rate, Burst: lim.Burst, MaxInflight: l.cfg.MaxInflight,
		MaxBacklog: l.cfg.MaxBacklog, Delivered: l.delivered.Load(),
	}
	switch t := l.cfg.Target; {
	case t.HTTP != nil:
		st.Target = t.HTTP.Method + " " + redactURL(t.HTTP.URL)
	case t.NATS != nil:
		st.Target = "nats " + t.NATS.Subject
	case t.Handler != "":
		st.Target = "handler " + t.Handler
	}
	l.mu.Lock()
	switch {
	case l.pacerDown:
		st.Paused, st.PauseReason = true, "lane state store unavailable"
	case time.Now().Before(l.pauseTill):
		st.Paused, st.PauseReason = true, "downstream asked to wait until "+l.pauseTill.UTC().Format(time.RFC3339)
	}
	l.mu.Unlock()
	stats, err := l.queue.Stats(ctx, l.cfg.Name)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	st.Backlog, st.Waiting, st.InFlight = stats.Stored, stats.Pending, stats.AckPending
	if n, err := l.queue.CountDead(ctx, l.cfg.Name); err == nil {
		st.Dead = n
	}
	if n, err := l.queue.RetriesWaiting(ctx, l.cfg.Name); err == nil {
		st.Retrying = n
	}
	return st
}

// laneObserver feeds the drain's events to metrics and the lane's state.
type laneObserver lane

func (o *laneObserver) Started(late time.Duration) {
	o.metrics.StartLateness.WithLabelValues(o.cfg.Name).Observe(late.Seconds())
}

func (o *laneObserver) Reserved(n int) {
	o.metrics.SlotsReserved.WithLabelValues(o.cfg.Name).Add(float64(n))
}

func (o *laneObserver) PacerDown(down bool, _ error) {
	o.mu.Lock()
	o.pacerDown = down
	o.mu.Unlock()
	v := 1.0
	if down {
		v = 0
	}
	o.metrics.PacerUp.WithLabelValues(o.cfg.Name).Set(v)
}
