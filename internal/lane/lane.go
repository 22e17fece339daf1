// Package lane runs one lane: it opens the lane's target, wires its queue
// consumer to a leaky drain paced by the lane's shared GCRA state, delivers
// each started job, and settles it (ack, wait in place, retry behind the
// backlog, dead letter) by the pure policy in Settle. It holds the lane's
// runtime state: the limit (changed at runtime by PATCH), a downstream's
// pause and adaptive mode's slow-down, shared with the other instances
// through typed control messages (control.go), and reports the lane's
// status.
//
// The package is where queue, leaky and dispatch meet: queue knows nothing
// of pacing, leaky nothing of NATS, dispatch nothing of either.
package lane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// The queue's consumer is the drain's source, its messages the drain's
// items: queue knows nothing of leaky, and nothing is converted.
var (
	_ leaky.Source[*queue.Msg] = (*queue.Consumer)(nil)
)

// Lane is one lane at run time. Create it with New, Run it once, Close it
// after Run returned. Its methods are safe for concurrent use.
type Lane struct {
	cfg      config.Lane
	d        Deps
	log      *slog.Logger
	target   dispatch.Target
	closeTgt func()
	pull     *dispatch.Pull // pull mode only (pull.go)
	consumer *queue.Consumer
	drain    *leaky.Drain[*queue.Msg]
	backoff  dispatch.Backoff
	control  *nats.Subscription
	bounds   controlBounds
	keyed    *keyed.Pacer[*queue.Msg] // nil unless the lane is keyed (per_key)
	// replies are the reply subjects the lane's jobs may name
	// (results.reply_subjects); nil refuses every one.
	replies *records.Replies
	// keyedQ reads the keyed lane's jobs (nil unless keyed); its settled
	// jobs' deletes end before Run returns.
	keyedQ *queue.KeyedReader

	limit     atomic.Pointer[bucket.Limit]
	aimd      *leaky.AIMD // nil unless adaptive.enabled
	delivered atomic.Uint64
	runDone   <-chan struct{} // Run's context's Done, set before any delivery starts
	rateGauge prometheus.Gauge
	hot       hotMetrics   // the per-job series, looked up once
	recWrites recordWrites // the drain's record write series, when the lane keeps records
	starts    startWindow  // for the utilization gauge
	limited   startWindow  // the target's 429 answers, for the status
	// startsTotal counts the lane's starts on this instance; hist holds
	// its samples (history.go).
	startsTotal atomic.Uint64
	hist        history

	overMu sync.Mutex
	over   map[string]queue.KeyLimit // keyed lanes: per-key overrides
	// keyTargets are the keys' own targets (url, headers, signing
	// secret) made from their overrides; rules are an HTTP lane's lists
	// (dest.go).
	keyTargets map[string]*dispatch.KeyTarget
	rules      *dest.Rules

	hold hold // an operator's pause (hold.go)

	mu        sync.Mutex
	pacerDown bool
	pauseTill time.Time
}

// New sets up the lane's stream, consumer, target and drain. It starts
// nothing.
func New(ctx context.Context, cfg config.Lane, d Deps) (*Lane, error) {
	if d.Clock == nil {
		d.Clock = clock.Real
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	lim := bucket.Limit{Rate: cfg.Rate.PerSecond(), Burst: cfg.Burst}
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	l := &Lane{
		cfg: cfg, d: d, log: d.Logger.With("component", "lane", "lane", cfg.Name),
		backoff: dispatch.Backoff{Base: cfg.Retry.BackoffBase.D(), Max: cfg.Retry.BackoffMax.D()},
		bounds: controlBounds{MaxPause: dispatch.MaxPause, MinRate: bucket.MinRate, MaxRate: bucket.MaxRate,
			MaxBurst: bucket.MaxBurst},
	}
	l.limit.Store(&lim)
	if h := cfg.Target.HTTP; h != nil {
		var err error
		if l.rules, err = dest.New(h.DestConfig()); err != nil {
			return nil, fmt.Errorf("target.http.%w", err)
		}
	}
	if q := cfg.Quota; q != nil {
		l.log.Info("lane limit derived from its target's quota", "quota_limit", q.Limit, "quota_per", q.Per.D().String(),
			"rate", cfg.Rate.String(), "rate_per_second", lim.Rate, "burst", lim.Burst)
	}
	if a := cfg.Adaptive; a.Enabled {
		l.aimd = &leaky.AIMD{Decrease: a.Decrease, Increase: a.Increase, Min: a.Min, Interval: a.Interval.D()}
		l.bounds.MinFactor = a.Min
	}
	if h := cfg.Target.Handler; h != "" && d.Handlers[h] == nil {
		return nil, fmt.Errorf("target.handler: no handler %q is registered (service.Handle)", h)
	}
	if cfg.Results != nil && d.Records == nil {
		return nil, errors.New("results: this instance keeps no job records (lane.Deps.Records is nil)")
	}
	var err error
	if l.replies, err = lanesReplies(cfg, d); err != nil {
		return nil, err
	}
	if l.target, l.closeTgt, err = l.openTarget(ctx); err != nil {
		return nil, err
	}
	if err := l.setUp(ctx, lim); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// targetConfig turns the file's target into dispatch's.
func targetConfig(t config.Target, maxInflight int, handlers map[string]dispatch.Target) dispatch.TargetConfig {
	switch {
	case t.HTTP != nil:
		h := t.HTTP
		return dispatch.TargetConfig{SigningSecrets: h.SigningSecrets, HTTP: &dispatch.HTTPConfig{
			URL: h.URL, Method: h.Method, Headers: h.Headers, Timeout: h.Timeout.D(), RetryOther4xx: h.RetryOther4xx,
			Methods: h.Methods, ForwardHeaders: h.ForwardHeaders, JobURLs: h.JobURLs, MaxInflight: maxInflight}}
	case t.NATS != nil:
		return dispatch.TargetConfig{NATS: &dispatch.NATSConfig{Subject: t.NATS.Subject, Timeout: t.NATS.Timeout.D(), JetStream: t.NATS.JetStream}}
	case t.Handler != "":
		return dispatch.TargetConfig{Handler: handlers[t.Handler]}
	}
	return dispatch.TargetConfig{}
}

// setUp makes the stream and consumer, subscribes to control messages and
// builds the drain.
func (l *Lane) setUp(ctx context.Context, lim bucket.Limit) error {
	m, name := l.d.Metrics, l.cfg.Name
	m.InitLane(name)
	l.rateGauge = m.EffectiveRate.WithLabelValues(name)
	l.rateGauge.Set(lim.Rate)
	l.hot = newHotMetrics(m, name)
	m.PausedSeconds.WithLabelValues(name).Set(0)
	if l.keepsRecords() {
		l.recWrites = newRecordWrites(m, name)
	}
	if err := l.ensureRecords(ctx); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	sub, err := l.d.Bus.Subscribe(ControlSubject(name), l.onControl)
	if err != nil {
		return fmt.Errorf("control subscription: %w", err)
	}
	l.control = sub
	batch := leaky.BatchFor(lim.Rate, l.cfg.MaxInflight)
	spec := queue.LaneSpec{
		Name: name, MaxBacklog: l.cfg.MaxBacklog, MaxInflight: l.cfg.MaxInflight, Prefetch: batch,
		AckWait: l.cfg.AckWait.D(), MaxBody: int64(l.cfg.MaxBody), MaxBytes: int64(l.cfg.MaxBytes),
		DedupWindow: l.d.DedupWindow, Replicas: l.d.Replicas,
		MaxAge: l.cfg.MaxAge.D(), MaxDelay: l.cfg.MaxDelay.D(), CallbacksOnly: l.d.CallbackLanes[name],
	}
	if l.cfg.PerKey != nil {
		spec.Ordered = l.cfg.PerKey.Ordered
		if l.urlHost() {
			spec.URLKey, spec.KeyWithoutURL = l.rules.KeyOf, l.KeyWithoutURL
		}
		if l.d.Pair == nil || l.d.Claims == nil {
			return errors.New("per_key: the lane is keyed but no keyed pacer was given (Deps.Pair, Deps.Claims)")
		}
		if err := l.d.Queue.EnsureKeyedLane(ctx, spec); err != nil {
			return err
		}
		l.d.Queue.OnPoison(name, func() { m.DeadLettered.WithLabelValues(name).Inc() })
		// A job published over NATS whose id the lane held already: its
		// publisher had its PubAck from the intake stream, so a counter
		// is where it shows.
		l.d.Queue.OnDuplicate(name, func() { m.Submitted.WithLabelValues(name, "duplicate", "nats").Inc() })
		if l.keyed, err = l.newKeyed(); err != nil {
			return err
		}
		m.PacerUp.WithLabelValues(name).Set(1)
		m.WatchMissed(name, l.keyed.Missed)
		l.starts.begin(l.d.Clock.Now())
		m.WatchLane(name, l.metricState)
		return nil
	}
	if err := l.d.Queue.EnsureLane(ctx, spec); err != nil {
		return err
	}
	// Poison jobs are dead-lettered by the queue before the drain sees
	// them (queue/poison.go); they count like the drain's dead letters.
	l.d.Queue.OnPoison(name, func() { m.DeadLettered.WithLabelValues(name).Inc() })
	if l.consumer, err = l.d.Queue.Consumer(name); err != nil {
		return err
	}
	l.drain, err = leaky.New(leaky.Config[*queue.Msg]{
		Source:      l.source(),
		Pacer:       leaky.StorePacer{Store: l.d.Store, Key: bucket.Key{Lane: name}, Limit: l.EffectiveLimit},
		PausedUntil: l.pausedUntil,
		Held:        l.hold.held,
		Assigned:    l.assigned,
		Start:       l.start,
		MaxInflight: l.cfg.MaxInflight,
		Batch:       batch,
		Clock:       l.d.Clock,
		Logger:      l.log,
		Observer:    (*observer)(l),
	})
	if err != nil {
		return err
	}
	m.PacerUp.WithLabelValues(name).Set(1)
	m.WatchMissed(name, l.drain.Missed)
	l.starts.begin(l.d.Clock.Now())
	l.limited.begin(l.d.Clock.Now())
	m.WatchLane(name, l.metricState)
	return nil
}

// Name is the lane's name.
func (l *Lane) Name() string { return l.cfg.Name }

// Run drains the lane until ctx ends, with the consumer's keep-alive and the
// lane's retry mover beside it, then hands back what the drain holds and
// waits for the deliveries it started. dispatch bounds the deliveries: it
// outlives ctx (at a stop, deliveries in flight may finish after the drain
// stopped starting new ones); cancelling it cuts them short (they are
// released).
func (l *Lane) Run(ctx, dispatch context.Context) {
	l.runDone = ctx.Done()
	var watch sync.WaitGroup
	defer watch.Wait()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	loaded := make(chan struct{})
	watch.Go(func() { l.watchLimits(watchCtx, loaded) })
	watch.Go(func() { l.watchHistory(watchCtx) })
	// The stored limits first: a hold stored before this instance started
	// must stop its first fetch too. The store is on the queue's server, so
	// while it cannot be read no job could be fetched either.
	select {
	case <-loaded:
	case <-ctx.Done():
		return
	}
	if l.keyed != nil {
		l.runKeyed(ctx, dispatch)
		return
	}
	keepCtx, stopKeep := context.WithCancel(context.WithoutCancel(ctx))
	var helpers sync.WaitGroup
	helpers.Go(func() { l.consumer.KeepAlive(keepCtx) })
	helpers.Go(func() { l.d.Queue.MoveRetries(ctx, l.cfg.Name, l.log) })
	helpers.Go(func() { l.d.Queue.ShareReadAhead(ctx, l.cfg.Name, l.consumer) })
	_ = l.drain.RunWith(ctx, dispatch)
	l.stopPulls()
	l.consumer.Close()
	stopKeep()
	helpers.Wait()
}

// Close releases the lane's control subscription and target.
func (l *Lane) Close() {
	if l.control != nil {
		_ = l.control.Unsubscribe()
	}
	l.closeTgt()
}

// isStopping reports whether Run's context is done: the backends close
// after the last delivery, so from then on an ack is confirmed. Acks sent
// just before the stop began are not, and an embedded server shut down
// before applying one delivers that job again (at least once, G4).
func (l *Lane) isStopping() bool {
	select {
	case <-l.runDone:
		return true
	default:
		return false
	}
}

// start is the drain's Starter: it delivers the job on its own goroutine,
// bounded by the dispatch context dctx, and settles the message by the
// outcome.
func (l *Lane) start(dctx context.Context, msg *queue.Msg, done func()) {
	if msg.Expired(l.d.Clock.Now()) {
		// Not started by its expiry: dead-lettered instead. The check is
		// here, on the one goroutine that holds the job and right before
		// its delivery, so nothing can start it after it expired.
		go l.expire(dctx, msg, done)
		return
	}
	inflight := l.hot.inflight
	inflight.Inc()
	l.started(msg)
	go func() {
		defer done()
		defer inflight.Dec()
		job := msg.Job()
		intake := job.Outside && msg.FirstDelivery() && job.Attempts == 0
		if intake {
			// A job published on the lane's subject: intake of its own,
			// counted when the drain first meets it.
			l.d.Metrics.Submitted.WithLabelValues(l.cfg.Name, "queued", "nats").Inc()
		}
		replyErr := l.checkReply(job)
		var claim records.Claim
		if l.keepsRecords() {
			var ok bool
			if claim, ok = l.claim(dctx, msg, replyErr == nil); !ok {
				return
			}
		}
		if replyErr != nil {
			// Its answer would go nowhere the lane allows: dead-lettered,
			// never delivered.
			res := dispatch.Result{Verdict: dispatch.Dead, Err: replyErr}
			act := Action{Kind: Dead, Reason: reasonReplyRefused}
			if l.keepsRecords() {
				l.record(dctx, msg, claim, res, act)
			}
			l.apply(dctx, msg, res, act)
			return
		}
		tr := l.traceStart(msg, job, intake)
		res := l.target.Deliver(dctx, dispatch.Job{
			ID: job.ID, Lane: job.Lane, Key: job.Key, ContentType: job.ContentType, Payload: job.Payload,
			Attempt: msg.Attempt(), EnqueuedAt: msg.StoredAt(), Trace: tr.out, Dest: job.Dest, KeyTarget: l.keyTarget(job.Key),
		})
		tr.end(res, l.d.Clock.Now())
		l.hot.dispatchSeconds.Observe(res.Took.Seconds())
		l.hot.dispatched(res.Verdict).Inc()
		l.hot.answered(res)
		if res.Status == http.StatusTooManyRequests {
			l.limited.add(l.d.Clock.Now())
		}
		if l.keyed != nil && pushedBack(res) {
			l.keyed.PushedBack(dctx, job.Key)
		}
		act := Settle(Outcome{Result: res, Attempt: msg.Attempt(), MaxAttempts: l.cfg.Retry.MaxAttempts, Stopping: dctx.Err() != nil},
			func(attempt int) time.Duration { return l.backoff.Delay(attempt, rand.Float64) })
		if act.Kind == Wait {
			// Before the pause: it pushes the shared state at the limit
			// the drains reserve at, the slowed one, whose tolerance is
			// longer; written at the full rate it would let a slot start
			// before the wait ends.
			l.slowDown()
		}
		switch {
		case res.PauseLane > 0 && l.keyed != nil:
			// A keyed lane's downstream is the key's: it waits alone.
			l.keyed.PauseKey(dctx, job.Key, res.PauseLane)
		case res.PauseLane > 0:
			l.pause(dctx, res.PauseLane)
		}
		if l.keepsRecords() {
			// Before the ack: a crash in between delivers the job again,
			// and the record follows; never a settled job whose record
			// still says in_flight.
			l.record(dctx, msg, claim, res, act)
		}
		l.apply(dctx, msg, res, act)
	}()
}

// pushedBack says whether a delivery's answer asks its downstream to be
// spared: a 429, a 5xx, or a rate-limit signal (Retry-After, an exhausted
// RateLimit header).
func pushedBack(res dispatch.Result) bool {
	return res.Status == http.StatusTooManyRequests || res.Status >= 500 || res.PauseLane > 0
}

// assigned tells the instance that took msg over HTTP the slot the drain
// gave it (its intake answers "admitted" only for a free one, due at once).
func (l *Lane) assigned(msg *queue.Msg, s leaky.Slot) {
	msg.Slotted() // no longer read ahead: its slot is in the bucket's state
	if j := msg.Job(); j.Notify != "" && l.d.Hub != nil && msg.FirstDelivery() {
		name := j.ID
		if j.NotifyID != "" {
			name = j.NotifyID
		}
		l.d.Hub.Tell(j.Notify, j.Lane, name, s.Due.Sub(l.d.Clock.Now()), s.Free)
	}
}

// settleTimeout bounds the store calls of settling; they outlive a
// cancelled dispatch context, since the job has to go somewhere.
const settleTimeout = 5 * time.Second

// apply carries out a settle action on msg.
func (l *Lane) apply(dctx context.Context, msg *queue.Msg, res dispatch.Result, act Action) {
	job := msg.Job()
	// The logger with the job's attributes and the store calls' context are
	// made only on the paths that use them: a delivered job (the hot path)
	// needs neither, and building them cost more than its ack.
	log := func() *slog.Logger {
		return l.log.With("id", job.ID, "attempt", msg.Attempt(), "status", res.Status, "err", errString(res.Err))
	}
	settleCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(dctx), settleTimeout)
	}
	switch act.Kind {
	case Ack:
		l.settledKeyed(dctx, msg)
		l.delivered.Add(1)
		ack := msg.Ack
		if l.isStopping() {
			// The backends close after the last delivery: only a confirmed
			// ack is sure to be applied before then.
			ack = func() error {
				ctx, cancel := settleCtx()
				defer cancel()
				return msg.AckSync(ctx)
			}
		}
		if err := ack(); err != nil {
			log().Warn("ack failed; the job may be delivered again", "ack_err", err)
		} else {
			l.settled(msg)
		}
	case Release:
		_ = msg.Release()
	case Retry:
		if l.keyed != nil && l.cfg.PerKey.Ordered {
			// An ordered key's failing job holds its key, in place: a
			// copy at the tail would start after the key's later jobs.
			l.retryInPlace(dctx, msg, act.Delay)
			log().Warn("delivery failed, retrying in place (ordered key)", "key", job.Key, "retry_in", act.Delay.String())
			_ = msg.Wait(act.Delay)
			return
		}
		log().Warn("delivery failed, retrying later", "retry_in", act.Delay.String())
		ctx, cancel := settleCtx()
		defer cancel()
		switch err := msg.Retry(ctx, act.Delay); {
		case errors.Is(err, queue.ErrAckUnconfirmed):
			log().Warn("retry stored; the original's ack was not confirmed: it may be delivered once more", "ack_err", err)
		case err != nil:
			log().Warn("requeue failed; the job waits in place", "requeue_err", err)
		}
	case Wait:
		// Slowed down already, before the pause (start).
		log().Info("target rate-limited the job; it waits without using an attempt", "wait", act.Delay.String())
		_ = msg.Wait(act.Delay)
	case Dead:
		l.d.Metrics.DeadLettered.WithLabelValues(l.cfg.Name).Inc()
		log := log()
		log.Error("job dead-lettered", "reason", act.Reason)
		ctx, cancel := settleCtx()
		defer cancel()
		err := msg.Dead(ctx, queue.DeadInfo{Reason: act.Reason, LastStatus: res.Status, LastError: errString(res.Err)}, l.cfg.Retry.BackoffMax.D())
		if errors.Is(err, queue.ErrAckUnconfirmed) {
			log.Warn("dead letter stored; the original's ack was not confirmed: it may be delivered once more", "ack_err", err)
			err = nil
		}
		if err != nil {
			log.Error("dead-lettering failed; the job will be retried", "dead_err", err)
		} else {
			l.settledKeyed(dctx, msg)
			l.settled(msg)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// EffectiveLimit is the lane's limit now: the configured (or PATCHed) one,
// slowed down by adaptive mode when it is on.
func (l *Lane) EffectiveLimit() bucket.Limit {
	lim := *l.limit.Load()
	if l.aimd != nil {
		lim.Rate *= l.aimd.Factor(l.d.Clock.Now())
	}
	l.rateGauge.Set(lim.Rate)
	return lim
}

// Admission is what intake needs to decide on one of the lane's jobs.
func (l *Lane) Admission() admission.Lane {
	a := admission.Lane{Name: l.cfg.Name, Limit: l.EffectiveLimit(), MaxBacklog: l.cfg.MaxBacklog, MaxWait: l.cfg.MaxWait.D()}
	if l.keyed != nil {
		kl := l.keyLimit("")
		a.KeyLimit = &kl
	}
	return a
}

// KeyLimit is key's limit now, on a keyed lane: per_key, its override,
// times its adaptive slow-down (as this instance knows it).
func (l *Lane) KeyLimit(key string) bucket.Limit {
	if l.keyed == nil {
		return l.keyLimit(key)
	}
	return l.keyed.KeyLimit(key, l.d.Clock.Now())
}

// KeyStarted counts key's jobs started (or reserved to start) and not
// settled: across the fleet with shared leases (Deps.Leases), else on this
// instance, the only one.
func (l *Lane) KeyStarted(ctx context.Context, key string) (int, error) {
	if l.keyed == nil {
		return 0, ErrNotKeyed
	}
	if l.d.Leases != nil {
		return l.d.Leases.Held(ctx, l.cfg.Name, key)
	}
	return l.keyed.Key(key).Inflight, nil
}

// MaxBody is the largest payload the lane takes, in bytes.
func (l *Lane) MaxBody() int64 { return int64(l.cfg.MaxBody) }

// AdmitWait bounds how long intake waits to hear a job's slot.
func (l *Lane) AdmitWait() time.Duration { return l.cfg.AdmitWait.D() }

func (l *Lane) pausedUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pauseTill
}

// holdUntil records a pause locally; it never shortens one.
func (l *Lane) holdUntil(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if until.After(l.pauseTill) {
		l.pauseTill = until
	}
}

// publish sends a control message to every instance (this one included).
func (l *Lane) publish(c control) error {
	c.From = l.d.Instance
	return l.d.Bus.Publish(ControlSubject(l.cfg.Name), c.encode())
}

// onControl applies a control message from any instance (this one
// included), after checking it against the lane's bounds, and logs what
// changed.
func (l *Lane) onControl(m *nats.Msg) {
	c, err := parseControl(m.Data, l.bounds)
	if errors.Is(err, errUnknownVersion) {
		l.log.Warn("control message of another version ignored", "err", err, "subject", m.Subject)
		return
	}
	if err != nil {
		l.log.Warn("control message refused", "err", err, "from", c.From, "subject", m.Subject)
		return
	}
	now := l.d.Clock.Now()
	switch c.Kind {
	case kindPause:
		d := time.Duration(c.PauseMillis) * time.Millisecond
		l.holdUntil(now.Add(d))
		l.log.Info("control: lane paused", "for", d.String(), "from", c.From)
	case kindFactor:
		if l.aimd.Adopt(c.Factor, now) {
			l.log.Info("control: lane slowed down", "factor", c.Factor, "rate", l.cfg.Rate.PerSecond()*c.Factor, "from", c.From)
		}
	case kindLimit:
		lim := bucket.Limit{Rate: c.Rate, Burst: c.Burst}
		if old := l.limit.Swap(&lim); *old != lim {
			l.log.Info("control: lane limit changed", "rate", lim.Rate, "burst", lim.Burst, "was", old.String(), "from", c.From)
		}
	}
}

// SetLimit changes the lane's limit here at once and on every other
// instance through the control subject, and stores it (Deps.Limits) so
// that it outlives restarts.
func (l *Lane) SetLimit(lim bucket.Limit) error {
	c := control{Kind: kindLimit, Rate: lim.Rate, Burst: lim.Burst}
	if _, err := parseControl(c.encode(), l.bounds); err != nil {
		return err
	}
	l.limit.Store(&lim)
	if err := l.publish(c); err != nil {
		return fmt.Errorf("telling the other instances: %w", err)
	}
	if l.d.Limits != nil {
		// Stored, so that it outlives the instances' restarts.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := l.d.Limits.PutLane(ctx, l.cfg.Name, queue.LaneLimit{Rate: lim.Rate, Burst: lim.Burst, At: time.Now().UTC()}); err != nil {
			return fmt.Errorf("storing the limit: %w", err)
		}
	}
	return nil
}

// pause holds every dispatch of the lane for d on every instance: the shared
// state is pushed past the pause (no slot is granted inside it) and a control
// message makes every drain give up the slots it already holds.
func (l *Lane) pause(dctx context.Context, d time.Duration) {
	d = min(d, l.bounds.MaxPause)
	name := l.cfg.Name
	l.d.Metrics.LanePaused.WithLabelValues(name).Inc()
	l.holdUntil(l.d.Clock.Now().Add(d))
	l.d.Metrics.PausedSeconds.WithLabelValues(name).Set(d.Seconds())
	// Back to 0 when the lane's pause ends, which a later pause (from
	// here or another instance) may have pushed back.
	var reset func()
	reset = func() {
		if left := l.pausedUntil().Sub(l.d.Clock.Now()); left > 0 {
			time.AfterFunc(left, reset)
			return
		}
		l.d.Metrics.PausedSeconds.WithLabelValues(name).Set(0)
	}
	time.AfterFunc(d, reset)
	_ = l.publish(control{Kind: kindPause, PauseMillis: max(d.Milliseconds(), 1)})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(dctx), time.Second)
	defer cancel()
	if err := l.d.Store.Pause(ctx, bucket.Key{Lane: name}, l.EffectiveLimit(), d); err != nil {
		l.log.Warn("pausing the lane in the shared state failed", "for", d.String(), "err", err)
		return
	}
	l.log.Info("downstream asked the lane to wait", "for", d.String())
}

// slowDown applies adaptive mode's decrease for a rate-limit answer and
// tells the other instances.
func (l *Lane) slowDown() {
	if l.aimd == nil {
		return
	}
	f, changed := l.aimd.Limited(l.d.Clock.Now())
	if !changed {
		return
	}
	_ = l.publish(control{Kind: kindFactor, Factor: f})
	l.log.Info("target rate-limited the lane; slowing down", "rate", l.cfg.Rate.PerSecond()*f)
}

// Status reports the lane's limits and live state. Counts that need
// JetStream are missing (and Error says why) while it is away.
func (l *Lane) Status(ctx context.Context) api.LaneStatus {
	lim := l.EffectiveLimit()
	conf := l.limit.Load().Rate
	now := l.d.Clock.Now()
	starts, span := l.starts.count(now)
	limited, _ := l.limited.count(now)
	st := api.LaneStatus{
		Name: l.cfg.Name, Rate: conf, EffectiveRate: lim.Rate, Burst: lim.Burst, MaxInflight: l.cfg.MaxInflight,
		MaxBacklog: l.cfg.MaxBacklog, Delivered: l.delivered.Load(), Target: describeTarget(l.cfg.Target),
		Adaptive: l.aimd != nil, Utilization: utilization(starts, span, conf),
		Recent429: uint64(limited), Recent429Seconds: windowSeconds, Results: l.keepsRecords(),
	}
	if q := l.cfg.Quota; q != nil {
		st.Quota = &api.Quota{Limit: q.Limit, Per: q.Per.D().String(), Burst: q.Burst}
	}
	held, by, since := l.hold.state()
	l.mu.Lock()
	switch {
	case held:
		st.Paused, st.PausedByOperator = true, true
		st.PauseReason = "paused by an operator since " + since.UTC().Format(time.RFC3339)
		if by != "" {
			st.PauseReason = "paused by " + by + " since " + since.UTC().Format(time.RFC3339)
		}
	case l.pacerDown:
		st.Paused, st.PauseReason = true, "lane state store unavailable"
	case now.Before(l.pauseTill):
		until := l.pauseTill.UTC()
		st.Paused, st.PauseReason, st.PausedUntil = true, "downstream asked to wait until "+until.Format(time.RFC3339), &until
	}
	l.mu.Unlock()
	stats, err := l.d.Queue.Stats(ctx, l.cfg.Name)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	st.Backlog, st.Waiting, st.InFlight = stats.Stored, stats.Pending, stats.AckPending
	if k := l.keyed; k != nil {
		ks := k.Stats(l.d.Clock.Now())
		st.InFlight = int(k.Inflight())
		st.Waiting = stats.Stored - min(stats.Stored, uint64(st.InFlight))
		st.Keyed = &api.KeyedStatus{PerKeyRate: l.cfg.PerKey.Rate.PerSecond(), PerKeyBurst: l.cfg.PerKey.Burst,
			PerKeyMaxInflight: l.cfg.PerKey.MaxInflight, Ordered: l.cfg.PerKey.Ordered, KeysActive: ks.Active, KeysPaused: ks.Paused}
		if busiest, err := l.d.Queue.BusiestKeys(ctx, l.cfg.Name, api.BusiestKeys, admission.BacklogMaxAge); err == nil {
			for _, b := range busiest {
				st.Keyed.Keys = append(st.Keyed.Keys, api.KeyBacklog{Key: b.Key, Backlog: b.Stored})
			}
		}
	}
	if n, err := l.d.Queue.CountDead(ctx, l.cfg.Name); err == nil {
		st.Dead = n
	}
	if n, err := l.d.Queue.RetriesWaiting(ctx, l.cfg.Name); err == nil {
		st.Retrying = n
	}
	return st
}

// describeTarget names a target for the lanes API, without secrets.
func describeTarget(t config.Target) string {
	switch {
	case t.HTTP != nil:
		return t.HTTP.Method + " " + config.RedactURL(t.HTTP.URL)
	case t.NATS != nil:
		return "nats " + t.NATS.Subject
	case t.Handler != "":
		return "handler " + t.Handler
	}
	return ""
}

// observer feeds the drain's events to metrics and the lane's state.
type observer Lane

func (o *observer) Started(late time.Duration) {
	o.d.Metrics.StartLateness.WithLabelValues(o.cfg.Name).Observe(late.Seconds())
}

func (o *observer) Reserved(n int) {
	o.d.Metrics.SlotsReserved.WithLabelValues(o.cfg.Name).Add(float64(n))
}

func (o *observer) PacerDown(down bool, _ error) {
	o.mu.Lock()
	o.pacerDown = down
	o.mu.Unlock()
	v := 1.0
	if down {
		v = 0
	}
	o.d.Metrics.PacerUp.WithLabelValues(o.cfg.Name).Set(v)
}
