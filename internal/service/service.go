// Package service assembles the throttler from its parts and holds no lane
// decision of its own: configuration in, a running service out. It opens
// NATS JetStream (external or embedded) and Redis (package backend),
// registers the instance (package instance), picks the lane state store
// (Redis, or in memory for a single instance), starts each lane (package
// lane), serves the HTTP API (package ingest, through package apiserver),
// and stops in order: intake first, then the drains, then in-flight
// dispatches (bounded by shutdown_timeout), then the clients.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/apiserver"
	"github.com/throttler/throttler/internal/backend"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/instance"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/keyed/redisclaims"
	"github.com/throttler/throttler/internal/lane"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/tracing"
)

// Service is one throttler instance. Create it with New and call Run once.
type Service struct {
	cfg config.Config
	log *slog.Logger
	reg *prometheus.Registry

	ready chan struct{}
	addr  string         // set before ready closes
	nats  *server.Server // the embedded NATS server; set before ready closes, nil with nats.url

	// guardTiming is the instance guard's; zero: instance.DefaultTiming.
	guardTiming instance.Timing
	// queueStatsEvery is how often the lanes' JetStream-derived gauges
	// are read; zero: lane.DefaultQueueStatsEvery.
	queueStatsEvery time.Duration
	// historyEvery is the lanes' throughput sampling interval; zero:
	// lane.DefaultHistoryEvery.
	historyEvery time.Duration
	// maxWaiters bounds the requests waiting for their jobs' answers;
	// zero: records.DefaultMaxWaiters.
	maxWaiters int

	handlers map[string]dispatch.Target

	// web is the API's server once it serves (what Reload swaps keys,
	// caller quotas and certificate in).
	web atomic.Pointer[apiserver.Server]
	// reloadConfig, when set, reads the config file again for Reload.
	reloadConfig func() (config.Config, error)
	// traces makes the intake, queue and attempt spans; nil: none.
	traces *tracing.Tracer
}

// TraceWith makes the service record spans through t: one for each
// submission, each job's wait in its queue and each delivery attempt
// (docs/OPERATIONS.md, OpenTelemetry). Without it no span is made, and a
// job's W3C trace context still travels from its submitter to its target.
// The caller owns t (runs its exports, and flushes it after Run
// returns). Call it before
// Run.
func (s *Service) TraceWith(t *tracing.Tracer) { s.traces = t }

// ReloadConfigWith makes Reload read the config file again through load
// (the API keys in it and the callers section take effect; other settings
// need a restart). Call it before Run.
func (s *Service) ReloadConfigWith(load func() (config.Config, error)) { s.reloadConfig = load }

// Handle registers an in-process target under name, for lanes whose config
// says target: {handler: name}. Call it before Run. It lets a Go program
// embed the throttler and receive its jobs without a network hop.
func (s *Service) Handle(name string, t dispatch.Target) {
	if s.handlers == nil {
		s.handlers = map[string]dispatch.Target{}
	}
	s.handlers[name] = t
}

// New returns a service for cfg. It starts nothing. reg may be nil (a fresh
// registry is made).
func New(cfg config.Config, logger *slog.Logger, reg *prometheus.Registry) *Service {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	return &Service{cfg: cfg, log: logger, reg: reg, ready: make(chan struct{})}
}

// Ready is closed once the HTTP API listens and every lane drains.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Addr is the HTTP API's address; valid after Ready is closed.
func (s *Service) Addr() string { return s.addr }

// EmbeddedNATS is the NATS server the service runs in its own process, nil
// when it connects to nats.url; valid after Ready is closed. A program that
// embeds the service can open an in-process connection to it
// (queue.ConnectEmbedded), the kind the service itself publishes over.
func (s *Service) EmbeddedNATS() *server.Server { return s.nats }

// Run starts everything, serves until ctx ends, then stops in order. It
// returns nil after a clean stop, or the error that kept it from starting.
func (s *Service) Run(ctx context.Context) (err error) {
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	nb, err := backend.OpenNATS(s.cfg.NATS, s.cfg.Lanes, s.log)
	if err != nil {
		return err
	}
	closers = append(closers, nb.Close)
	backend.FitBodies(s.cfg.Lanes, nb.Conn.MaxPayload(), s.log) // no-op on the embedded server, sized for them
	nc := nb.Conn
	s.nats = nb.Embedded()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}

	// Misconfiguration guard: one in-memory pacer per JetStream, and none
	// next to instances that share Redis. Losing the claim later cancels
	// ctx; Run then stops and returns why.
	ctx, claim, err := instance.Claim(ctx, instance.Config{
		JetStream: js, Timing: s.guardTiming, Logger: s.log,
		Self: instance.Info{Listen: s.cfg.Listen, Pacer: pacerKind(s.cfg), Held: s.held()},
	})
	if err != nil {
		return err
	}
	closers = append(closers, claim.Release)
	defer func() {
		if lost := claim.Lost(); lost != nil && err == nil {
			err = lost
		}
	}()

	m := metrics.New(s.reg)
	s.reg.MustRegister(metrics.RuntimeCollectors()...)

	st, err := s.openStore(ctx, m, claim.ID(), claim.HeldByOthers)
	if err != nil {
		return err
	}
	closers = append(closers, st.close)
	store, pair := lane.CountCalls(st.store, st.pair, m)

	q, err := queue.New(nc, s.log.With("component", "queue"))
	if err != nil {
		return err
	}
	if err := q.EnsureRetries(ctx, queue.RetryConfig{MaxMsgs: s.cfg.Retries.MaxMessages, MaxBytes: int64(s.cfg.Retries.MaxBytes), Replicas: s.cfg.NATS.Replicas,
		DedupWindow: s.cfg.NATS.DedupWindow.D()}); err != nil {
		return s.noRoom("retries.max_bytes", err)
	}
	if err := q.EnsureDeadLetters(ctx, queue.DeadConfig{MaxAge: s.cfg.DeadLetters.MaxAge.D(), MaxBytes: int64(s.cfg.DeadLetters.MaxBytes), Replicas: s.cfg.NATS.Replicas}); err != nil {
		return s.noRoom("dead_letters.max_bytes", err)
	}

	// Dispatches get their own context: at shutdown they may finish within
	// shutdown_timeout after the drains stopped starting new ones.
	dispatchCtx, cancelDispatch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDispatch()
	hub, err := queue.NewHub(nc, claim.ID(), s.log)
	if err != nil {
		return err
	}
	closers = append(closers, hub.Close)
	recs, err := records.New(nc, s.log)
	if err != nil {
		return err
	}
	// Delayed, expiring and replayed jobs move their records too.
	hook := records.NewHook(recs, s.log)
	q.SetScheduleHook(hook)
	q.SetReplayHook(hook)
	// A settled job that names a callback sends its record as a job of its
	// lane's results.callback_lane.
	recs.SetCallbacks(q)
	// One subscription for every caller of this instance that waits for
	// its job's answer (?wait=), made before any job is taken.
	waiters := records.NewWaiters(nc, claim.ID(), s.maxWaiters, s.log)
	if err := waiters.Listen(); err != nil {
		return err
	}
	closers = append(closers, waiters.Close)
	m.WatchWaiters(waiters.Waiting)
	limits, err := q.EnsureLimits(ctx, s.cfg.NATS.Replicas)
	if err != nil {
		return err
	}
	deps := lane.Deps{
		Limits: limits,
		Bus:    nc, Targets: lane.NATSTargets{Conn: nc, Pull: nb.Pull, Guard: dispatch.NewGuard(s.allowNetworks())}, Queue: q, Store: store, Pair: pair, Claims: st.claims, Slow: st.slow, Leases: st.leases, Handlers: s.handlers,
		Metrics: m, Logger: s.log, DedupWindow: s.cfg.NATS.DedupWindow.D(),
		Replicas: s.cfg.NATS.Replicas, Instance: claim.ID(), Hub: hub, Records: recs,
		Workers: backend.PullWorkers(s.cfg.NATS, s.cfg.Lanes),
		Traces:  s.traces, HistoryEvery: s.historyEvery, CallbackLanes: callbackLanes(s.cfg.Lanes),
	}
	lanes := apiserver.NewLanes()
	laneNames := make([]string, 0, len(s.cfg.Lanes))
	for i, lc := range s.cfg.Lanes {
		l, err := lane.New(ctx, lc, deps)
		if err != nil {
			// Named like a config error: the field is where to look.
			if errors.Is(err, queue.ErrNoRoom) {
				return s.noRoom(fmt.Sprintf("lanes[%d].max_bytes", i), err)
			}
			return &config.Error{Field: fmt.Sprintf("lanes[%d]", i), Msg: err.Error()}
		}
		closers = append(closers, l.Close)
		lanes.Add(l, lc)
		laneNames = append(laneNames, lc.Name)
	}

	adm, err := admission.New(admission.Config{Store: store, Backlog: q, Logger: s.log.With("component", "admission")})
	if err != nil {
		return err
	}
	web, err := apiserver.New(s.cfg, s.log)
	if err != nil {
		return err
	}
	httpAPI, err := ingest.New(ingest.Config{
		Callers:  web.Callers(apiserver.CallersConfig{Redis: st.pipe, Lanes: st.store, Metrics: m, LaneNames: laneNames}),
		Admitter: adm, Publisher: q, Scheduler: q, Assignments: hub, Lanes: lanes, Metrics: m, DeadLetters: q, Keys: lanes, Pauser: lanes, History: lanes,
		// OpenMetrics for a scraper that asks for it (Accept), else text.
		MetricsHandler:  promhttp.HandlerFor(metrics.Exposed(s.reg), promhttp.HandlerOpts{Registry: s.reg, EnableOpenMetrics: true}),
		Logger:          s.log.With("component", "ingest"),
		Auth:            web.Auth(),
		MaxBodyInflight: int64(s.cfg.HTTP.MaxBodyInflight),
		// One caller's stalled uploads hold at most this share.
		MaxBodyInflightPerCaller: s.cfg.BodyInflightPerCaller(),
		MaxBatchItems:            s.cfg.HTTP.MaxBatchItems,
		MaxBatchBytes:            s.cfg.HTTP.BatchBytes(),
		Ready:                    nb.Ready,
		Traces:                   s.traces,
		Records:                  recs,
		Waiters:                  waiters,
		Stored:                   q,
	})
	if err != nil {
		return err
	}
	httpErr, err := web.Start(httpAPI)
	if err != nil {
		return err
	}
	s.web.Store(web)

	drainCtx, stopDrains := context.WithCancel(ctx)
	defer stopDrains()
	var drains sync.WaitGroup
	for _, l := range lanes.All() {
		drains.Go(func() { l.Run(drainCtx, dispatchCtx) })
	}
	checks := []backend.Check{{Name: metrics.BackendNATS, Ping: nc.FlushWithContext}}
	if st.ping != nil {
		checks = append(checks, backend.Check{Name: metrics.BackendRedis, Ping: st.ping})
	}
	drains.Go(func() {
		backend.Probe{Checks: checks, Metrics: m.Backends, Logger: s.log.With("component", "probe")}.Run(drainCtx)
	})
	drains.Go(func() {
		lane.WatchQueues(drainCtx, q, laneNames, m, s.queueStatsEvery, s.log.With("component", "metrics"))
	})
	s.addr = web.Addr()
	s.log.Info("throttler ready", "listen", s.addr, "tls", web.TLS(), "lanes", len(laneNames), "nats", nb.Where(), "pacer", pacerKind(s.cfg))
	close(s.ready)

	select {
	case <-ctx.Done():
	case err := <-httpErr:
		stopDrains()
		drains.Wait()
		return fmt.Errorf("http server: %w", err)
	}

	// Graceful stop: intake, drains, in-flight dispatches, clients.
	start := time.Now()
	timeout := s.cfg.ShutdownTimeout.D()
	s.log.Info("stopping: intake closed, finishing in-flight dispatches", "timeout", timeout.String())
	httpAPI.StopIntake()
	shCtx, cancel := context.WithTimeout(context.Background(), min(timeout, 5*time.Second))
	_ = web.Shutdown(shCtx)
	cancel()
	stopDrains()
	done := make(chan struct{})
	go func() { drains.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout - time.Since(start)):
		s.log.Warn("shutdown timeout: cancelling in-flight dispatches; they will be retried")
		cancelDispatch()
		<-done
	}
	s.log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

func (s *Service) allowNetworks() []netip.Prefix {
	var allow []netip.Prefix
	for _, p := range s.cfg.Dispatch.AllowNetworks {
		allow = append(allow, netip.MustParsePrefix(p)) // validated by config
	}
	return allow
}

// held is what this instance announces it may hold per lane: the slots its
// drains reserve ahead (leaky.MaxHeld of each lane's batch).
func (s *Service) held() map[string]int {
	if s.cfg.Redis.URL == "" {
		return nil
	}
	out := make(map[string]int, len(s.cfg.Lanes))
	for _, l := range s.cfg.Lanes {
		out[l.Name] = leaky.MaxHeld(leaky.BatchFor(l.Rate.PerSecond(), l.MaxInflight))
	}
	return out
}

func pacerKind(cfg config.Config) string {
	if cfg.Redis.URL == "" {
		return instance.PacerMemory
	}
	return instance.PacerRedis
}

// stores are the lanes' states and what keyed lanes share between
// instances besides them: the key claims and, on Redis only, keys'
// slow-downs and the fleet's in-flight leases (the memory pacer's single
// instance keeps its own). pipe is the Redis client they use; nil in
// memory.
type stores struct {
	store  bucket.Store
	pair   bucket.PairStore
	claims keyed.Claims
	slow   keyed.SlowStore
	leases keyed.Leases
	pipe   *redis.AutoPipeliner
	// ping checks Redis (the health probe); nil in memory.
	ping  func(ctx context.Context) error
	close func()
}

// openStore opens the stores: in Redis when configured, else in memory.
// heldByOthers (the instance registry's) tells how many slots of a lane the
// other live instances may hold: a state Redis lost is restored past them.
func (s *Service) openStore(ctx context.Context, m *metrics.Metrics, instance string, heldByOthers func(lane string) int) (stores, error) {
	if s.cfg.Redis.URL == "" {
		mem := &bucket.Memory{}
		return stores{store: mem, pair: mem, claims: keyed.Local{}, close: func() {}}, nil
	}
	rcfg := redisbucket.DefaultConfig()
	rcfg.Logger = s.log.With("component", "redisbucket")
	rcfg.Held = func(k bucket.Key) int { return heldByOthers(k.Lane) }
	if err := rcfg.Validate(); err != nil {
		return stores{}, err
	}
	rb, err := backend.OpenRedis(ctx, s.cfg.Redis, s.log)
	if err != nil {
		return stores{}, err
	}
	store := redisbucket.New(rb.Pipe, rcfg)
	m.WatchRestored(store.Restored)
	claims := redisclaims.New(rb.Pipe, redisclaims.Config{Prefix: rcfg.Prefix, Instance: instance})
	ping := func(ctx context.Context) error { return rb.Client.Ping(ctx).Err() }
	return stores{store: store, pair: store, claims: claims, slow: claims, leases: claims, pipe: rb.Pipe, ping: ping, close: rb.Close}, nil
}

// Reload reads auth.keys_file (with ReloadConfigWith, the config file's
// auth keys and callers section too) and the TLS certificate and key again
// and swaps them in at once, without dropping a connection or a request in
// flight (what SIGHUP does). A file that fails its checks is logged and
// the keys or certificate in use stay. It returns what failed.
func (s *Service) Reload() error {
	web := s.web.Load()
	if web == nil {
		return apiserver.ErrNotRunning
	}
	return web.Reload(s.reloadConfig)
}

// noRoom names field when JetStream had no room to reserve a stream's
// max_bytes (queue.ErrNoRoom), with what the embedded server may use, what
// its streams reserve already (those of lanes no longer configured among
// them) and what this config's streams need; any other err passes
// unchanged.
func (s *Service) noRoom(field string, err error) error {
	if !errors.Is(err, queue.ErrNoRoom) {
		return err
	}
	fix := "lower it or another stream's max_bytes (lanes[].max_bytes, retries.max_bytes, dead_letters.max_bytes), or give JetStream more storage"
	if s.nats != nil {
		if jsc := s.nats.JetStreamConfig(); jsc != nil {
			_, reserved, _ := s.nats.JetStreamReservedResources()
			fix = fmt.Sprintf("the embedded server may use %v (three quarters of the disk free at nats.data_dir "+
				"when it started, and of what its streams held then), its streams reserve %v already, and this "+
				"config's streams need %v in all: lower lanes[].max_bytes, retries.max_bytes or dead_letters.max_bytes, "+
				"free disk, delete the streams of lanes no longer configured, or set nats.url",
				config.ByteSize(jsc.MaxStore), config.ByteSize(reserved), config.ByteSize(s.cfg.StreamBytes()))
		}
	}
	return &config.Error{Field: field, Msg: err.Error() + "; " + fix}
}

// callbackLanes are the lanes some lane names as its results.callback_lane.
func callbackLanes(lanes []config.Lane) map[string]bool {
	out := map[string]bool{}
	for _, lc := range lanes {
		if r := lc.Results; r != nil && r.CallbackLane != "" {
			out[r.CallbackLane] = true
		}
	}
	return out
}
