// Package service assembles the throttler from its parts and holds no lane
// decision of its own: configuration in, a running service out. It connects
// to (or embeds) NATS JetStream, registers the instance (package instance),
// picks the lane state store (Redis, or in memory for a single instance),
// starts each lane (package lane), serves the HTTP API (package ingest), and
// stops in order: intake first, then the drains, then in-flight dispatches
// (bounded by shutdown_timeout), then the clients.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
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
)

// Service is one throttler instance. Create it with New and call Run once.
type Service struct {
	cfg config.Config
	log *slog.Logger
	reg *prometheus.Registry

	ready chan struct{}
	addr  string // set before ready closes

	// guardTiming is the instance guard's; zero: instance.DefaultTiming.
	guardTiming instance.Timing
	// queueStatsEvery is how often the lanes' JetStream-derived gauges
	// are read; zero: lane.DefaultQueueStatsEvery.
	queueStatsEvery time.Duration

	handlers map[string]dispatch.Target

	// access holds what Reload swaps: API keys, TLS certificate.
	access access
	// reloadConfig, when set, reads the config file again for Reload.
	reloadConfig func() (config.Config, error)
}

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

// Run starts everything, serves until ctx ends, then stops in order. It
// returns nil after a clean stop, or the error that kept it from starting.
func (s *Service) Run(ctx context.Context) (err error) {
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	nc, srv, err := s.connectNATS()
	if err != nil {
		return err
	}
	closers = append(closers, func() { closeNATS(nc, srv) })
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
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	store, pair, shared, rc, closeStore, err := s.openStore(ctx, m, claim.ID(), claim.HeldByOthers)
	if err != nil {
		return err
	}
	closers = append(closers, closeStore)
	fold := lanesFold(store, s.cfg.Redis.Mode)
	store, pair = lane.CountCalls(store, pair, m)

	q, err := queue.New(nc, s.log.With("component", "queue"))
	if err != nil {
		return err
	}
	if err := q.EnsureRetries(ctx, queue.RetryConfig{MaxMsgs: s.cfg.Retries.MaxMessages, MaxBytes: int64(s.cfg.Retries.MaxBytes), Replicas: s.cfg.NATS.Replicas}); err != nil {
		return err
	}
	if err := q.EnsureDeadLetters(ctx, queue.DeadConfig{MaxAge: s.cfg.DeadLetters.MaxAge.D(), MaxBytes: int64(s.cfg.DeadLetters.MaxBytes), Replicas: s.cfg.NATS.Replicas}); err != nil {
		return err
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
	limits, err := q.EnsureLimits(ctx, s.cfg.NATS.Replicas)
	if err != nil {
		return err
	}
	deps := lane.Deps{
		Limits: limits,
		NATS:   nc, Queue: q, Store: store, Pair: pair, Claims: shared.claims, Slow: shared.slow, Slots: shared.slots, Guard: dispatch.NewGuard(s.allowNetworks()), Handlers: s.handlers,
		Metrics: m, Logger: s.log, DispatchCtx: dispatchCtx, DedupWindow: s.cfg.NATS.DedupWindow.D(),
		Replicas: s.cfg.NATS.Replicas, Instance: claim.ID(), Hub: hub,
	}
	lanes := &directory{byName: map[string]*lane.Lane{}, cfg: map[string]config.Lane{}, keyFns: map[string]keyFns{}}
	for i, lc := range s.cfg.Lanes {
		lanes.cfg[lc.Name] = lc
		l, err := lane.New(ctx, lc, deps)
		if err != nil {
			// Named like a config error: the field is where to look.
			return &config.Error{Field: fmt.Sprintf("lanes[%d]", i), Msg: err.Error()}
		}
		closers = append(closers, l.Close)
		lanes.byName[lc.Name] = l
		lanes.order = append(lanes.order, l)
		if lc.PerKey != nil {
			// Made once: a method value is a new closure each time.
			lanes.keyFns[lc.Name] = keyFns{limit: l.KeyLimit, started: l.KeyStarted}
		}
	}

	adm, err := admission.New(admission.Config{Store: store, Backlog: q, Logger: s.log.With("component", "admission")})
	if err != nil {
		return err
	}
	auth, err := s.apiAuth()
	if err != nil {
		return err
	}
	tc, err := s.tlsConfig()
	if err != nil {
		return err
	}
	callers := s.callers(rc, fold, m, names(s.cfg.Lanes))
	httpAPI, err := ingest.New(ingest.Config{
		Callers:  callers,
		Admitter: adm, Publisher: q, Slots: hub, Lanes: lanes, Metrics: m, DeadLetters: q, Keys: lanes,
		// OpenMetrics for a scraper that asks for it (Accept), else text.
		MetricsHandler:  promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg, EnableOpenMetrics: true}),
		Logger:          s.log.With("component", "ingest"),
		Auth:            auth,
		MaxBodyInflight: int64(s.cfg.HTTP.MaxBodyInflight),
		MaxBatchItems:   s.cfg.HTTP.MaxBatchItems,
		MaxBatchBytes:   s.cfg.HTTP.BatchBytes(),
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
	ln, err := s.listen(tc)
	if err != nil {
		return err
	}
	httpSrv := s.httpServer(httpAPI, tc)
	httpErr := make(chan error, 1)
	go func() {
		if tc != nil {
			httpErr <- httpSrv.ServeTLS(ln, "", "") // the certificate comes from tc
			return
		}
		httpErr <- httpSrv.Serve(ln)
	}()
	s.access.mu.Lock()
	s.access.api = httpAPI
	s.access.mu.Unlock()

	drainCtx, stopDrains := context.WithCancel(ctx)
	defer stopDrains()
	var drains sync.WaitGroup
	laneNames := make([]string, 0, len(lanes.order))
	for _, l := range lanes.order {
		drains.Go(func() { l.Run(drainCtx) })
		laneNames = append(laneNames, l.Name())
	}
	drains.Go(func() {
		lane.WatchQueues(drainCtx, q, laneNames, m, s.queueStatsEvery, s.log.With("component", "metrics"))
	})
	s.addr = ln.Addr().String()
	s.log.Info("throttler ready", "listen", s.addr, "tls", tc != nil, "lanes", len(lanes.order), "nats", natsWhere(s.cfg), "pacer", pacerKind(s.cfg))
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

func natsWhere(cfg config.Config) string {
	if cfg.NATS.URL == "" {
		return "embedded"
	}
	return config.RedactURL(cfg.NATS.URL)
}

func pacerKind(cfg config.Config) string {
	if cfg.Redis.URL == "" {
		return instance.PacerMemory
	}
	return instance.PacerRedis
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
	n := s.cfg.NATS
	if n.User != "" {
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	if n.URL != "" {
		if n.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(n.CredsFile))
		}
		if n.NkeySeedFile != "" {
			o, err := nats.NkeyOptionFromSeed(n.NkeySeedFile)
			if err != nil {
				return nil, nil, &config.Error{Field: "nats.nkey_seed_file", Msg: err.Error()}
			}
			opts = append(opts, o)
		}
		if n.TLS.CAFile != "" {
			opts = append(opts, nats.RootCAs(n.TLS.CAFile))
		}
		if n.TLS.CertFile != "" {
			opts = append(opts, nats.ClientCert(n.TLS.CertFile, n.TLS.KeyFile))
		}
		nc, err := nats.Connect(n.URL, append(opts, nats.RetryOnFailedConnect(false))...)
		if err != nil {
			return nil, nil, scrubbed(fmt.Errorf("nats.url %s: %w", config.RedactURL(n.URL), err), n.URL)
		}
		s.fitBodies(nc)
		return nc, nil, nil
	}
	var pubs []queue.EmbeddedPublisher
	for _, p := range n.Publishers {
		pubs = append(pubs, queue.EmbeddedPublisher{User: p.User, Password: p.Password, Lanes: p.Lanes})
	}
	srv, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: n.DataDir, Listen: n.Listen,
		MaxPayload: s.maxMessage(), User: n.User, Password: n.Password, Publishers: pubs, Workers: s.embeddedWorkers(),
		Logger: s.log.With("component", "nats")})
	if err != nil {
		return nil, nil, err
	}
	nc, err := queue.ConnectEmbedded(srv, opts...)
	if err != nil {
		srv.Shutdown()
		return nil, nil, err
	}
	if mem := s.cfg.EmbeddedMemory(); mem > config.EmbeddedMemoryWarn {
		// The store is in this process: a burst that fills the lanes'
		// bounds takes this much, mostly JetStream's de-duplication index.
		s.log.Warn("embedded nats: the lanes' bounds allow more memory than a small instance expects",
			"estimate_mb", mem/1_000_000, "warn_mb", config.EmbeddedMemoryWarn/1_000_000,
			"dedup_ids", s.cfg.DedupIDs(), "dedup_window", n.DedupWindow.D().String(),
			"fix", "shorten nats.dedup_window, lower lanes[].max_backlog, or set nats.url (docs/OPERATIONS.md, Memory of the embedded server)")
	}
	return nc, srv, nil
}

// closeNATS drains the connection, then stops the embedded server if any.
func closeNATS(nc *nats.Conn, srv *server.Server) {
	_ = nc.Drain()
	for nc.Status() == nats.DRAINING_SUBS || nc.Status() == nats.DRAINING_PUBS {
		time.Sleep(5 * time.Millisecond)
	}
	nc.Close()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
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

// openStore returns the lane state store, the same states for keyed lanes'
// slots, the keyed lanes' claims, and the Redis client the caller quotas
// share: Redis when configured, else memory (and a nil client).
// heldByOthers (the instance registry's) tells how many slots of a lane the
// other live instances may hold: a state Redis lost is restored past them.
func (s *Service) openStore(ctx context.Context, m *metrics.Metrics, instance string, heldByOthers func(lane string) int) (bucket.Store, bucket.PairStore, keyedShared, *redis.AutoPipeliner, func(), error) {
	if s.cfg.Redis.URL == "" {
		mem := &bucket.Memory{}
		return mem, mem, keyedShared{claims: keyed.Local{}}, nil, func() {}, nil
	}
	opt, err := redisOptions(s.cfg.Redis)
	if err != nil {
		return nil, nil, keyedShared{}, nil, nil, err
	}
	client := redis.NewUniversalClient(opt)
	// Concurrent admissions and reservations share pipelines: one round trip
	// for many calls (docs/BENCHMARKS.md).
	pipe, err := client.AutoPipeline()
	if err != nil {
		_ = client.Close()
		return nil, nil, keyedShared{}, nil, nil, fmt.Errorf("redis: %w", err)
	}
	rcfg := redisbucket.DefaultConfig()
	rcfg.Logger = s.log.With("component", "redisbucket")
	rcfg.Held = func(k bucket.Key) int { return heldByOthers(k.Lane) }
	if err := rcfg.Validate(); err != nil {
		return nil, nil, keyedShared{}, nil, nil, err
	}
	store := redisbucket.New(pipe, rcfg)
	m.WatchRestored(store.Restored)
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		s.log.Warn("redis unreachable at start; admission queues and drains wait until it answers", "err", scrubbed(err, s.cfg.Redis.URL))
	}
	stopReload := func() {}
	if cc, ok := client.(*redis.ClusterClient); ok {
		stopReload = reloadClusterState(cc)
	}
	claims := redisclaims.New(pipe, redisclaims.Config{Prefix: rcfg.Prefix, Instance: instance})
	return store, store, keyedShared{claims: claims, slow: claims, slots: claims}, pipe, func() { stopReload(); _ = pipe.Close(); _ = client.Close() }, nil
}

// keyedShared is what keyed lanes share between instances besides their
// GCRA states: the key claims and, on Redis only, keys' slow-downs and the
// fleet's in-flight slots (the memory pacer's single instance keeps its
// own).
type keyedShared struct {
	claims keyed.Claims
	slow   keyed.SlowStore
	slots  keyed.Slots
}

// clusterReloadEvery is how often a Redis Cluster client reloads the slot
// map: go-redis reloads it on MOVED replies, not when the master of a slot
// dies, and so kept dialing a dead master for tens of seconds after its
// replica took over (internal/fleet TestRedisClusterHundredLanes). One
// CLUSTER SLOTS a second per instance is cheap.
const clusterReloadEvery = time.Second

// reloadClusterState reloads cc's slot map every clusterReloadEvery until
// stop is called.
func reloadClusterState(cc *redis.ClusterClient) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(clusterReloadEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				cc.ReloadState(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// redisOptions reads redis.url in the form of redis.mode and makes one set
// of client options for every kind. Every kind fails fast while Redis is
// away: one dial attempt, no command retries, deadlines honoured, so the
// drain pauses and admission queues at once.
func redisOptions(cfg config.Redis) (*redis.UniversalOptions, error) {
	bad := func(err error) error {
		return &config.Error{Field: "redis.url", Msg: config.ScrubURL(err.Error(), cfg.URL)}
	}
	var u redis.UniversalOptions
	switch cfg.Mode {
	case "cluster":
		o, err := redis.ParseClusterURL(cfg.URL)
		if err != nil {
			return nil, bad(err)
		}
		u = redis.UniversalOptions{Addrs: o.Addrs, IsClusterMode: true, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig}
	case "sentinel":
		o, err := redis.ParseFailoverURL(cfg.URL)
		if err != nil {
			return nil, bad(err)
		}
		u = redis.UniversalOptions{Addrs: o.SentinelAddrs, MasterName: o.MasterName, DB: o.DB, Username: o.Username, Password: o.Password,
			SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword, TLSConfig: o.TLSConfig}
	default:
		o, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, bad(err)
		}
		u = redis.UniversalOptions{Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig}
	}
	u.ContextTimeoutEnabled, u.DialerRetries, u.MaxRetries, u.DialTimeout = true, 1, -1, 500*time.Millisecond
	return &u, nil
}

// scrubbed hides the secrets of rawURL in err's message, keeping err for
// errors.Is and errors.As.
func scrubbed(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	return scrubbedError{msg: config.ScrubURL(err.Error(), rawURL), err: err}
}

type scrubbedError struct {
	msg string
	err error
}

func (e scrubbedError) Error() string { return e.msg }
func (e scrubbedError) Unwrap() error { return e.err }

// KeyStatus implements ingest.KeyDirectory.
func (d *directory) KeyStatus(_ context.Context, name, key string) (api.KeyStatus, error) {
	st, err := d.byName[name].KeyStatus(key)
	return st, keyErr(err)
}

// SetKey implements ingest.KeyDirectory.
func (d *directory) SetKey(ctx context.Context, name, key string, c ingest.KeyChange, by string) (api.KeyStatus, error) {
	lc := lane.KeyChange{MaxInflight: c.MaxInflight, Weight: c.Weight, Paused: c.Paused, Burst: c.Burst, Reset: c.Reset}
	if c.Rate != nil {
		r := c.Rate.PerSecond()
		lc.Rate = &r
	}
	st, err := d.byName[name].SetKey(ctx, key, lc, by)
	return st, keyErr(err)
}

func keyErr(err error) error {
	if errors.Is(err, lane.ErrNotKeyed) {
		return ingest.ErrNotKeyed
	}
	return err
}

// directory implements ingest.Directory over the running lanes.
type directory struct {
	byName map[string]*lane.Lane
	order  []*lane.Lane
	cfg    map[string]config.Lane
	// keyFns are the keyed lanes' key lookups, made once per lane rather
	// than per request.
	keyFns map[string]keyFns
}

// keyFns are a keyed lane's lookups that ingest asks of each key.
type keyFns struct {
	limit   func(key string) bucket.Limit
	started func(ctx context.Context, key string) (int, error)
}

func (d *directory) Lane(name string) (ingest.Lane, bool) {
	l, ok := d.byName[name]
	if !ok {
		return ingest.Lane{}, false
	}
	c := d.cfg[name]
	il := ingest.Lane{Admission: l.Admission(), MaxBody: l.MaxBody(), AdmitWait: l.AdmitWait(), Cost: c.Cost, Observe: c.Observe}
	if f, ok := d.keyFns[name]; ok {
		il.KeyLimit, il.KeyStarted = f.limit, f.started
	}
	return il, true
}

func (d *directory) SetLimit(ctx context.Context, name string, rate float64, burst int) (api.LaneStatus, error) {
	l, ok := d.byName[name]
	if !ok {
		return api.LaneStatus{}, fmt.Errorf("no lane %q", name)
	}
	if err := l.SetLimit(bucket.Limit{Rate: rate, Burst: burst}); err != nil {
		return api.LaneStatus{}, err
	}
	return l.Status(ctx), nil
}

func (d *directory) Status(ctx context.Context) []api.LaneStatus {
	out := make([]api.LaneStatus, 0, len(d.order))
	for _, l := range d.order {
		out = append(out, l.Status(ctx))
	}
	return out
}

// embeddedWorkers are the pull-mode worker users of the embedded server,
// each allowed the work and outcome subjects of its lanes (every pull-mode
// lane when it lists none).
func (s *Service) embeddedWorkers() []queue.EmbeddedWorker {
	var out []queue.EmbeddedWorker
	for _, w := range s.cfg.NATS.Workers {
		var publish []string
		for _, l := range s.cfg.Lanes {
			if !l.Target.Pull() || (len(w.Lanes) > 0 && !slices.Contains(w.Lanes, l.Name)) {
				continue
			}
			publish = append(publish, l.Target.NATS.Subject, dispatch.AckPrefix(l.Target.NATS.Subject)+".>")
		}
		out = append(out, queue.EmbeddedWorker{User: w.User, Password: w.Password, Publish: publish})
	}
	return out
}
