package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/testenv"
)

// env is what the scenarios share: the configuration, a temporary root, the
// Redis they use, the progress display and the service logs.
type env struct {
	cfg  Config
	dur  time.Duration
	tmp  string
	run  string // short id that makes lane names unique on a shared NATS
	prog *progress

	redisOnce   sync.Once
	redisURL    string
	redisSkip   string // why the Redis rows are skipped
	redisErr    error
	redisServer *testenv.Redis // started by the env; nil with Config.RedisURL

	mu      sync.Mutex
	streams []string // lanes created on an external NATS, deleted at close
	logs    tail
}

func newEnv(cfg Config) (*env, error) {
	tmp, err := os.MkdirTemp(cfg.TempDir, "throttler-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	id := strings.ToLower(nuid.Next())
	return &env{cfg: cfg, dur: cfg.duration(), tmp: tmp, run: id[len(id)-6:], prog: newProgress(cfg.Progress)}, nil
}

// close stops what the env started and removes its files.
func (e *env) close() {
	if e.cfg.NATSURL != "" && len(e.streams) > 0 {
		if nc, err := nats.Connect(e.cfg.NATSURL, nats.Timeout(2*time.Second)); err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for _, l := range e.streams {
				_ = js.DeleteStream(ctx, queue.StreamName(l))
			}
			cancel()
			nc.Close()
		}
	}
	if e.redisServer != nil {
		e.redisServer.Close()
	}
	_ = os.RemoveAll(e.tmp)
}

// lane returns a lane name unique to this run.
func (e *env) lane(name string) string {
	l := "bench-" + e.run + "-" + name
	if e.cfg.NATSURL != "" {
		e.mu.Lock()
		e.streams = append(e.streams, l)
		e.mu.Unlock()
	}
	return l
}

// dir returns a fresh directory under the env's temporary root.
func (e *env) dir(name string) string {
	d := filepath.Join(e.tmp, name+"-"+strings.ToLower(nuid.Next()[16:]))
	_ = os.MkdirAll(d, 0o755)
	return d
}

// logger is the services' logger: warnings and errors, kept for an error row.
func (e *env) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(&e.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// logTail is the end of the services' log, for an error row.
func (e *env) logTail() string {
	s := e.logs.String()
	if s == "" {
		return ""
	}
	return " (service log tail: " + strings.ReplaceAll(strings.TrimSpace(s), "\n", " | ") + ")"
}

// tail keeps the last few KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailKeep = 2048

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailKeep {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailKeep:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// loopbackURL checks that raw is a URL of one of schemes whose host is a
// loopback address or localhost: the tool never sends load elsewhere.
func loopbackURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	ok := false
	for _, s := range schemes {
		ok = ok || u.Scheme == s
	}
	if !ok {
		return fmt.Errorf("%q: scheme must be %s", raw, strings.Join(schemes, " or "))
	}
	if !isLoopback(u.Hostname()) {
		return fmt.Errorf("%q: the bench only targets loopback (127.0.0.0/8, ::1, localhost)", raw)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// freeAddr returns a free TCP address on 127.0.0.1, below the kernel's
// ephemeral range (testenv.PickPort): a process binds it a moment later.
func freeAddr() (string, error) {
	port, err := testenv.PickPort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// redis returns the Redis URL for the Redis rows, or a reason to skip them.
func (e *env) redis() (url, skip string, err error) {
	e.redisOnce.Do(func() {
		if e.cfg.RedisURL != "" {
			e.redisURL = e.cfg.RedisURL
			return
		}
		r, lerr := testenv.LaunchRedis(e.dir("redis"))
		switch {
		case errors.Is(lerr, exec.ErrNotFound):
			e.redisSkip = "skipped: redis-server not found on PATH (apt-get install redis-server, or pass --redis-url)"
		case lerr != nil:
			e.redisErr = fmt.Errorf("bench: %w", lerr)
		default:
			e.redisServer, e.redisURL = r, r.URL()
		}
	})
	return e.redisURL, e.redisSkip, e.redisErr
}

// laneOpts are the limits of a generated lane.
type laneOpts struct {
	rate     float64
	burst    int
	inflight int
	backlog  int64
	maxBytes int64 // the lane stream's max_bytes; 0: the default
	// perKey makes the lane keyed with these per-key limits; nil: not keyed.
	perKey *perKeyOpts
	// results turns the lane's job records on (results: {keep: 1h}).
	results bool
	// jobURLs and forward are the target's job_urls and forward_headers.
	jobURLs, forward []string
}

// perKeyOpts are a keyed lane's per_key limits.
type perKeyOpts struct {
	rate  float64
	burst int
}

// svcOpts describes a generated service configuration.
type svcOpts struct {
	// conns raises http.max_connections and max_connections_per_ip to it
	// (0: the defaults).
	conns      int
	dataDir    string
	natsURL    string // empty: embedded server in dataDir
	natsListen string // the embedded server's client address; empty: none
	replicas   int    // nats.replicas; 0: the default
	redisURL   string // empty: in-memory pacer
	listen     string // empty: a free port
	target     string // every lane delivers here
	lanes      map[string]laneOpts
}

// yaml writes the options as a config file. Fields it leaves out take the
// service's defaults, so the file stays valid as the config grows.
func (o svcOpts) yaml() []byte {
	q := strconv.Quote
	listen := o.listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nshutdown_timeout: 5s\n", q(listen))
	fmt.Fprintf(&b, "nats:\n  url: %s\n  data_dir: %s\n  listen: %s\n", q(o.natsURL), q(o.dataDir), q(o.natsListen))
	if o.replicas > 0 {
		fmt.Fprintf(&b, "  replicas: %d\n", o.replicas)
	}
	fmt.Fprintf(&b, "redis:\n  url: %s\n", q(o.redisURL))
	if o.conns > 0 {
		fmt.Fprintf(&b, "http:\n  max_connections: %d\n  max_connections_per_ip: %d\n", o.conns, o.conns)
	}
	b.WriteString("dispatch:\n  allow_networks: [\"127.0.0.0/8\", \"::1/128\"]\nlog:\n  level: warn\nlanes:\n")
	for _, name := range slices.Sorted(maps.Keys(o.lanes)) {
		l := o.lanes[name]
		fmt.Fprintf(&b, "  - name: %s\n    rate: %s\n    burst: %d\n    max_inflight: %d\n    max_backlog: %d\n",
			q(name), strconv.FormatFloat(l.rate, 'g', -1, 64), l.burst, l.inflight, l.backlog)
		if l.maxBytes > 0 {
			fmt.Fprintf(&b, "    max_bytes: %d\n", l.maxBytes)
		}
		if l.results {
			b.WriteString("    results: {keep: 1h, max_wait: 5m}\n")
		}
		if k := l.perKey; k != nil {
			fmt.Fprintf(&b, "    per_key: {rate: %s, burst: %d}\n", strconv.FormatFloat(k.rate, 'g', -1, 64), k.burst)
		}
		fmt.Fprintf(&b, "    target:\n      http:\n        url: %s\n        timeout: 10s\n", q(o.target))
		for _, list := range []struct {
			key  string
			vals []string
		}{{"job_urls", l.jobURLs}, {"forward_headers", l.forward}} {
			if len(list.vals) > 0 {
				quoted := make([]string, len(list.vals))
				for i, v := range list.vals {
					quoted[i] = q(v)
				}
				fmt.Fprintf(&b, "        %s: [%s]\n", list.key, strings.Join(quoted, ", "))
			}
		}
	}
	return []byte(b.String())
}

// serviceConfig loads the generated configuration the way `serve` loads a
// file: defaults applied, validated.
func (e *env) serviceConfig(o svcOpts) (config.Config, error) {
	if o.natsURL == "" {
		o.natsURL = e.cfg.NATSURL
	}
	if o.natsURL != "" && o.replicas == 0 {
		o.replicas = e.cfg.Replicas
	}
	cfg, err := config.Parse("generated bench config", o.yaml(), nil)
	if err != nil {
		return config.Config{}, fmt.Errorf("bench: %w", err)
	}
	return cfg, nil
}

// running is a service started by startService.
type running struct {
	svc    *service.Service
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// startService runs the service in-process and waits until it is ready.
func (e *env) startService(ctx context.Context, cfg config.Config) (*running, error) {
	return e.startServiceWith(ctx, cfg, nil)
}

// startServiceWith is startService with setUp (when not nil) called on
// the service before it runs.
func (e *env) startServiceWith(ctx context.Context, cfg config.Config, setUp func(*service.Service)) (*running, error) {
	reg := prometheus.NewRegistry()
	svc := service.New(cfg, e.logger(), reg)
	if setUp != nil {
		setUp(svc)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &running{svc: svc, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- svc.Run(sctx) }()
	select {
	case <-svc.Ready():
		return r, nil
	case err := <-r.done:
		cancel()
		if err == nil {
			err = errors.New("stopped before it was ready")
		}
		return nil, fmt.Errorf("bench: service: %w", err)
	case <-time.After(60 * time.Second):
		r.stop()
		return nil, errors.New("bench: service not ready within 60s")
	}
}

// stop stops the service and waits (bounded) for it.
func (r *running) stop() {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
	}
}

// counter sums the values of a counter family's series whose labels include
// every pair of want.
func (r *running) counter(family string, want map[string]string) float64 {
	sum := 0.0
	for _, m := range r.series(family, want) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// histogram reads the cumulative bucket counts of the histogram series of
// family whose labels include every pair of want: upper bounds and counts,
// +Inf last.
func (r *running) histogram(family string, want map[string]string) (bounds []float64, counts []uint64) {
	ms := r.series(family, want)
	if len(ms) == 0 {
		return nil, nil
	}
	h := ms[0].GetHistogram()
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
		counts = append(counts, b.GetCumulativeCount())
	}
	return append(bounds, math.Inf(1)), append(counts, h.GetSampleCount())
}

// series gathers the series of family whose labels include every pair of
// want (none when the registry cannot be gathered).
func (r *running) series(family string, want map[string]string) []*dto.Metric {
	mfs, err := r.reg.Gather()
	if err != nil {
		return nil
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == k && lp.GetValue() == v)
				}
				if !found {
					continue metric
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// quantileBound is the upper bound of the histogram bucket that holds the
// q quantile of the observations between two reads of the same series
// (before, after: cumulative counts); NaN when there were none.
func quantileBound(bounds []float64, before, after []uint64, q float64) float64 {
	if len(after) == 0 || len(after) != len(bounds) {
		return math.NaN()
	}
	at := func(i int) uint64 {
		if len(before) == len(after) {
			return after[i] - before[i]
		}
		return after[i]
	}
	total := at(len(after) - 1)
	if total == 0 {
		return math.NaN()
	}
	for i := range bounds {
		if float64(at(i)) >= q*float64(total) {
			return bounds[i]
		}
	}
	return math.Inf(1)
}

// withNATS runs f against the NATS the service of dataDir uses: the env's
// external server, or an embedded server started on dataDir (stopped when f
// returns, so that the service can take the directory over).
func (e *env) withNATS(ctx context.Context, dataDir string, f func(js jetstream.JetStream) error) error {
	var nc *nats.Conn
	var err error
	if e.cfg.NATSURL != "" {
		nc, err = nats.Connect(e.cfg.NATSURL, nats.Timeout(5*time.Second))
	} else {
		srv, serr := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dataDir})
		if serr != nil {
			return serr
		}
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		nc, err = queue.ConnectEmbedded(srv)
	}
	if err != nil {
		return fmt.Errorf("bench: nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(publishWindow))
	if err != nil {
		return err
	}
	return f(js)
}

// publishWindow is how many async publishes may await their ack.
const publishWindow = 2048

// publishN stores n messages with payload on subject through async
// publishes, a window at a time, and returns when JetStream acked them all.
// With ids each message carries a unique Nats-Msg-Id, like a job submitted
// over HTTP. It stops at ctx's end.
func publishN(ctx context.Context, js jetstream.JetStream, subject string, n int, payload []byte, ids bool, progress func(done int)) error {
	_, err := publishWindowed(ctx, js, subject, n, payload, ids, false, progress, nil)
	return err
}

// publishWindowed publishes n copies of payload asynchronously, waiting
// for the acks of every publishWindow, with a Nats-Msg-Id each when ids.
// It returns how many the server stored; a refusal from the server is
// counted as not stored when refusals are allowed, and fails otherwise.
// set, when not nil, adds message i's headers.
func publishWindowed(ctx context.Context, js jetstream.JetStream, subject string, n int, payload []byte, ids, refusals bool, progress func(done int), set func(i int, m *nats.Msg)) (int, error) {
	prefix := nuid.Next()
	stored := 0
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	wait := func() error {
		for _, f := range futures {
			select {
			case <-f.Ok():
				stored++
			case err := <-f.Err():
				var api *jetstream.APIError
				if !refusals || !errors.As(err, &api) {
					return fmt.Errorf("bench: publish to %s: %w", subject, err)
				}
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
				return fmt.Errorf("bench: publish to %s: no ack within 30s", subject)
			}
		}
		futures = futures[:0]
		return nil
	}
	for i := range n {
		var opts []jetstream.PublishOpt
		if ids {
			opts = append(opts, jetstream.WithMsgID(prefix+strconv.Itoa(i)))
		}
		m := nats.NewMsg(subject)
		m.Data = payload
		if set != nil {
			set(i, m)
		}
		f, err := js.PublishMsgAsync(m, opts...)
		if err != nil {
			return stored, fmt.Errorf("bench: publish to %s: %w", subject, err)
		}
		futures = append(futures, f)
		if len(futures) == cap(futures) || i == n-1 {
			if err := wait(); err != nil {
				return stored, err
			}
			if progress != nil {
				progress(i + 1)
			}
		}
	}
	return stored, nil
}

// prefill stores count[lane] messages on the streams of cfg's lanes while
// no service drains them. The service is started and stopped once first, so
// that the streams and consumers are exactly the ones it sets up. then, with
// the service stopped, f (if not nil) runs on the same server.
func (e *env) prefill(ctx context.Context, cfg config.Config, count map[string]int, payload []byte, then func(js jetstream.JetStream) error) error {
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return err
	}
	svc.stop()
	return e.withNATS(ctx, cfg.NATS.DataDir, func(js jetstream.JetStream) error {
		total, done := 0, 0
		for _, n := range count {
			total += n
		}
		for _, l := range cfg.Lanes {
			n := count[l.Name]
			if n == 0 {
				continue
			}
			err := publishN(ctx, js, queue.Subject(l.Name, ""), n, payload, false, func(d int) {
				e.prog.set("prefill", done+d, total)
			})
			if err != nil {
				return err
			}
			done += n
		}
		if then != nil {
			return then(js)
		}
		return nil
	})
}
