// Package service assembles the throttler from its parts: configuration in,
// a running service out. It connects to (or embeds) NATS JetStream, picks
// the lane state store (Redis, or in memory for a single instance), sets up
// each lane's stream, drain and target, serves the HTTP API, and stops in
// order: intake first, then the drains, then in-flight dispatches (bounded by
// shutdown_timeout), then the clients.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
)

// Service is one throttler instance. Create it with New and call Run once.
type Service struct {
	cfg config.Config
	log *slog.Logger
	reg *prometheus.Registry

	ready chan struct{}
	addr  string // set before ready closes

	// guardTiming is the instance guard's (singleton.go); zero: defaults.
	guardTiming guardTiming

	handlers map[string]dispatch.Target
}

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

// Run starts everything, serves until ctx ends, then stops in order. It
// returns nil after a clean stop, or the error that kept it from starting.
func (s *Service) Run(ctx context.Context) (err error) {
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	// NATS: embedded or remote.
	nc, srv, err := s.connectNATS()
	if err != nil {
		return err
	}
	closers = append(closers, func() {
		_ = nc.Drain()
		for nc.Status() == nats.DRAINING_SUBS || nc.Status() == nats.DRAINING_PUBS {
			time.Sleep(5 * time.Millisecond)
		}
		nc.Close()
		if srv != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	})

	// Misconfiguration guard (singleton.go): one in-memory pacer per
	// JetStream, and none next to instances that share Redis. Losing the
	// claim later cancels ctx; Run then stops and returns why.
	ctx, claim, err := s.claimPacer(ctx, nc)
	if err != nil {
		return err
	}
	closers = append(closers, claim.release)
	defer func() {
		if lost := claim.lostErr(); lost != nil && err == nil {
			err = lost
		}
	}()

	m := metrics.New(s.reg)
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	store, closeStore, err := s.openStore(ctx)
	if err != nil {
		return err
	}
	closers = append(closers, closeStore)

	q, err := queue.New(nc, s.log.With("component", "queue"))
	if err != nil {
		return err
	}
	var allow []netip.Prefix
	for _, p := range s.cfg.Dispatch.AllowNetworks {
		allow = append(allow, netip.MustParsePrefix(p)) // validated by config
	}
	guard := dispatch.NewGuard(allow)

	// Dispatches get their own context: at shutdown they may finish within
	// shutdown_timeout after the drains stopped starting new ones.
	dispatchCtx, cancelDispatch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDispatch()

	if err := q.EnsureRetries(ctx, s.cfg.NATS.Replicas); err != nil {
		return err
	}
	if err := q.EnsureDeadLetters(ctx, queue.DeadConfig{MaxAge: s.cfg.DeadLetters.MaxAge.D(), MaxBytes: int64(s.cfg.DeadLetters.MaxBytes), Replicas: s.cfg.NATS.Replicas}); err != nil {
		return err
	}
	lanes := &directory{lanes: map[string]*lane{}}
	for i := range s.cfg.Lanes {
		lc := s.cfg.Lanes[i]
		l, err := newLane(ctx, laneDeps{
			cfg: lc, nc: nc, handlers: s.handlers, dedup: s.cfg.NATS.DedupWindow.D(), replicas: s.cfg.NATS.Replicas, queue: q, store: countingStore{store, m},
			guard: guard, metrics: m, log: s.log.With("component", "lane", "lane", lc.Name), dispatchCtx: dispatchCtx,
		})
		if err != nil {
			// Named like a config error: the field is where to look.
			return &config.Error{Field: fmt.Sprintf("lanes[%d]", i), Msg: err.Error()}
		}
		closers = append(closers, l.close)
		lanes.lanes[lc.Name] = l
		lanes.order = append(lanes.order, l)
	}

	adm, err := admission.New(admission.Config{Store: countingStore{store, m}, Backlog: q, Logger: s.log.With("component", "admission")})
	if err != nil {
		return err
	}
	api, err := ingest.New(ingest.Config{
		Admitter: adm, Publisher: q, Lanes: lanes, Metrics: m, DeadLetters: q,
		MetricsHandler: promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}),
		Logger:         s.log.With("component", "ingest"),
		Ready: func(context.Context) error {
			if st := nc.Status(); st != nats.CONNECTED {
				return fmt.Errorf("nats connection is %v", st)
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	httpSrv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	httpErr := make(chan error, 1)
	go func() { httpErr <- httpSrv.Serve(ln) }()

	drainCtx, stopDrains := context.WithCancel(ctx)
	defer stopDrains()
	var drains sync.WaitGroup
	for _, l := range lanes.order {
		drains.Add(1)
		go func() {
			defer drains.Done()
			l.run(drainCtx)
		}()
	}
	s.addr = ln.Addr().String()
	s.log.Info("throttler ready", "listen", s.addr, "lanes", len(lanes.order), "nats", natsWhere(s.cfg), "pacer", pacerKind(s.cfg))
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
	api.StopIntake()
	shCtx, cancel := context.WithTimeout(context.Background(), min(timeout, 5*time.Second))
	_ = httpSrv.Shutdown(shCtx)
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

func natsWhere(cfg config.Config) string {
	if cfg.NATS.URL == "" {
		return "embedded"
	}
	return cfg.NATS.URL
}

func pacerKind(cfg config.Config) string {
	if cfg.Redis.URL == "" {
		return "memory"
	}
	return "redis"
}

func (s *Service) connectNATS() (*nats.Conn, *server.Server, error) {
	opts := []nats.Option{
		nats.Name("throttler"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if err == nil || c.IsClosed() || c.IsDraining() {
				return // our own close at shutdown
			}
			s.log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			s.log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
	}
	if s.cfg.NATS.URL != "" {
		nc, err := nats.Connect(s.cfg.NATS.URL, append(opts, nats.RetryOnFailedConnect(false))...)
		if err != nil {
			return nil, nil, fmt.Errorf("nats.url %s: %w", s.cfg.NATS.URL, err)
		}
		s.fitBodies(nc)
		return nc, nil, nil
	}
	srv, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: s.cfg.NATS.DataDir, Listen: s.cfg.NATS.Listen,
		MaxPayload: s.maxMessage(), Logger: s.log.With("component", "nats")})
	if err != nil {
		return nil, nil, err
	}
	nc, err := queue.ConnectEmbedded(srv, opts...)
	if err != nil {
		srv.Shutdown()
		return nil, nil, err
	}
	return nc, srv, nil
}

// maxMessage is the largest message a lane can store: its max_body plus
// room for the headers.
func (s *Service) maxMessage() int32 {
	var m int64
	for _, l := range s.cfg.Lanes {
		m = max(m, int64(l.MaxBody))
	}
	return int32(m + queue.HeaderRoom)
}

// fitBodies lowers a lane's max_body, with a warning, where its largest job
// could not pass the NATS server's max_payload: such a body then gets a 413
// that names max_body instead of a 503 from a publish that cannot succeed.
func (s *Service) fitBodies(nc *nats.Conn) {
	limit := config.ByteSize(nc.MaxPayload() - queue.HeaderRoom)
	for i := range s.cfg.Lanes {
		if l := &s.cfg.Lanes[i]; l.MaxBody > limit {
			s.log.Warn("max_body lowered to fit the NATS server's max_payload", "lane", l.Name,
				"field", fmt.Sprintf("lanes[%d].max_body", i), "configured", int64(l.MaxBody), "effective", int64(limit), "max_payload", nc.MaxPayload())
			l.MaxBody = limit
		}
	}
}

// openStore returns the lane state store: Redis when configured, else memory.
func (s *Service) openStore(ctx context.Context) (bucket.Store, func(), error) {
	if s.cfg.Redis.URL == "" {
		return &bucket.Memory{}, func() {}, nil
	}
	client, err := redisClient(s.cfg.Redis)
	if err != nil {
		return nil, nil, err
	}
	// Concurrent admissions and reservations share pipelines: one round trip
	// for many calls (docs/BENCHMARKS.md).
	pipe, err := client.AutoPipeline()
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	rcfg := redisbucket.DefaultConfig()
	rcfg.Logger = s.log.With("component", "redisbucket")
	store := redisbucket.New(pipe, rcfg)
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		s.log.Warn("redis unreachable at start; admission queues and drains wait until it answers", "err", err)
	}
	return store, func() { _ = pipe.Close(); _ = client.Close() }, nil
}

// redisAPI is what the service needs of a go-redis client, whichever kind.
type redisAPI interface {
	AutoPipeline() (*redis.AutoPipeliner, error)
	Ping(ctx context.Context) *redis.StatusCmd
	Close() error
}

// redisClient builds the client for redis.mode. Every kind fails fast while
// Redis is away: one dial attempt, no command retries, deadlines honoured,
// so the drain pauses and admission queues at once.
func redisClient(cfg config.Redis) (redisAPI, error) {
	const dial = 500 * time.Millisecond
	switch cfg.Mode {
	case "cluster":
		opt, err := redis.ParseClusterURL(cfg.URL)
		if err != nil {
			return nil, &config.Error{Field: "redis.url", Msg: err.Error()}
		}
		opt.ContextTimeoutEnabled, opt.DialerRetries, opt.MaxRetries, opt.DialTimeout = true, 1, -1, dial
		return redis.NewClusterClient(opt), nil
	case "sentinel":
		opt, err := redis.ParseFailoverURL(cfg.URL)
		if err != nil {
			return nil, &config.Error{Field: "redis.url", Msg: err.Error()}
		}
		opt.ContextTimeoutEnabled, opt.DialerRetries, opt.MaxRetries, opt.DialTimeout = true, 1, -1, dial
		return redis.NewFailoverClient(opt), nil
	default:
		opt, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, &config.Error{Field: "redis.url", Msg: err.Error()}
		}
		opt.ContextTimeoutEnabled, opt.DialerRetries, opt.MaxRetries, opt.DialTimeout = true, 1, -1, dial
		return redis.NewClient(opt), nil
	}
}

// countingStore counts calls to the state store per lane and operation.
type countingStore struct {
	bucket.Store
	m *metrics.Metrics
}

func (c countingStore) count(k bucket.Key, op string) {
	c.m.PacerCalls.WithLabelValues(k.Lane, op).Inc()
}

func (c countingStore) Admit(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	c.count(k, "admit")
	return c.Store.Admit(ctx, k, l)
}

func (c countingStore) Reserve(ctx context.Context, k bucket.Key, l bucket.Limit, n int) (bucket.Reservation, error) {
	c.count(k, "reserve")
	return c.Store.Reserve(ctx, k, l, n)
}

func (c countingStore) Pause(ctx context.Context, k bucket.Key, l bucket.Limit, d time.Duration) error {
	c.count(k, "pause")
	return c.Store.Pause(ctx, k, l, d)
}

// directory implements ingest.Directory.
type directory struct {
	lanes map[string]*lane
	order []*lane
}

func (d *directory) Lane(name string) (ingest.Lane, bool) {
	l, ok := d.lanes[name]
	if !ok {
		return ingest.Lane{}, false
	}
	return l.intake(), true
}

func (d *directory) SetLimit(ctx context.Context, name string, rate float64, burst int) (ingest.LaneStatus, error) {
	l, ok := d.lanes[name]
	if !ok {
		return ingest.LaneStatus{}, fmt.Errorf("no lane %q", name)
	}
	if err := l.setLimit(bucket.Limit{Rate: rate, Burst: burst}); err != nil {
		return ingest.LaneStatus{}, err
	}
	return l.status(ctx), nil
}

func (d *directory) Status(ctx context.Context) []ingest.LaneStatus {
	out := make([]ingest.LaneStatus, 0, len(d.order))
	for _, l := range d.order {
		out = append(out, l.status(ctx))
	}
	return out
}

var errNoTarget = errors.New("no target configured")
