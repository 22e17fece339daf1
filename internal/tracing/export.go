package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config's zero fields. The batch size and the interval are
// OpenTelemetry's batch span processor's (OTEL_BSP_*); the queue holds
// four batches more than its default, since a drain makes three spans a
// job.
const (
	DefaultQueueSize = 8192
	DefaultBatchSize = 512
	DefaultInterval  = 5 * time.Second
	DefaultTimeout   = 10 * time.Second
	// DefaultScope names the instrumentation scope of the spans.
	DefaultScope = "github.com/throttler/throttler"
)

// Config says where spans go and how they are batched. Endpoint is
// required; the zero value of every other field is a default.
type Config struct {
	// Endpoint is the full URL exports are posted to
	// (http://collector:4318/v1/traces).
	Endpoint string
	// Headers are sent with every export (OTEL_EXPORTER_OTLP_HEADERS).
	Headers map[string]string
	// Timeout bounds one export, its retries included; zero:
	// DefaultTimeout.
	Timeout time.Duration
	// Gzip compresses the exports (OTEL_EXPORTER_OTLP_COMPRESSION=gzip).
	Gzip bool
	// Sampler decides which spans are recorded.
	Sampler Sampler
	// Resource describes the process (service.name, service.version, ...);
	// written in key order.
	Resource []Attr
	// Scope names the instrumentation scope; zero: DefaultScope.
	Scope string
	// QueueSize bounds the spans waiting for export (zero:
	// DefaultQueueSize); a span ended while it is full is dropped and
	// counted. BatchSize is the most spans one export carries (zero:
	// DefaultBatchSize); a full batch is exported at once, a partial one
	// every Interval (zero: DefaultInterval).
	QueueSize int
	BatchSize int
	Interval  time.Duration
	// Client posts the exports; nil: a client of its own.
	Client *http.Client
	// Logger receives export failures; nil: slog.Default().
	Logger *slog.Logger
	// Registry, when set, gets the tracer's counters.
	Registry prometheus.Registerer
}

// ErrConfig is the error of a Config that cannot work.
var ErrConfig = errors.New("tracing: invalid config")

// Tracer makes spans (Start, End), keeps the sampled ones in a bounded
// queue and exports them (Run, Flush). Create it with New.
type Tracer struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client

	mu      sync.Mutex
	pending []Span
	wake    chan struct{}

	// exportMu serializes exports and guards what they reuse.
	exportMu sync.Mutex
	spare    []Span
	buf      []byte
	scratch  []byte
	zbuf     bytes.Buffer
	zw       *gzip.Writer
	head     []byte // the request's fixed part: resource and scope
	resource []byte
	scope    []byte
	failed   int       // exports failed since the last one logged
	loggedAt time.Time // when a failure was last logged

	exported  prometheus.Counter
	queueFull prometheus.Counter
	lost      prometheus.Counter
}

// New checks cfg and returns a tracer; it starts nothing (Run exports).
func New(cfg Config) (*Tracer, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: endpoint %q is not an http or https URL", ErrConfig, cfg.Endpoint)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	cfg.BatchSize = min(cfg.BatchSize, cfg.QueueSize)
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Scope == "" {
		cfg.Scope = DefaultScope
	}
	t := &Tracer{cfg: cfg, log: cfg.Logger, client: cfg.Client, wake: make(chan struct{}, 1),
		pending: make([]Span, 0, cfg.QueueSize), spare: make([]Span, 0, cfg.QueueSize)}
	if t.log == nil {
		t.log = slog.Default()
	}
	if t.client == nil {
		t.client = &http.Client{}
	}
	t.resource, t.scope = encodeResource(cfg.Resource), encodeScope(cfg.Scope)
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "throttler_trace_spans_dropped_total",
		Help: "Sampled spans not exported: queue_full (ended while the export queue was full), export_failed (the collector did not take them).",
	}, []string{"reason"})
	t.queueFull, t.lost = dropped.WithLabelValues("queue_full"), dropped.WithLabelValues("export_failed")
	exported := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "throttler_trace_spans_exported_total",
		Help: "Spans the OTLP collector accepted.",
	})
	t.exported = exported
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(dropped); err != nil {
			return nil, fmt.Errorf("tracing: register metrics: %w", err)
		}
		if err := cfg.Registry.Register(exported); err != nil {
			return nil, fmt.Errorf("tracing: register metrics: %w", err)
		}
	}
	return t, nil
}

// End ends s at end: a sampled span is queued for export (dropped and
// counted when the queue is full); any other is forgotten. s may be
// reused after End; its attribute slice must stay as it is.
func (t *Tracer) End(s *Span, end time.Time) {
	if !s.Sampled() {
		return
	}
	s.End = end
	t.mu.Lock()
	if len(t.pending) >= t.cfg.QueueSize {
		t.mu.Unlock()
		t.queueFull.Inc()
		return
	}
	t.pending = append(t.pending, *s)
	full := len(t.pending) == t.cfg.BatchSize
	t.mu.Unlock()
	if full {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// Run exports the queued spans, a batch as soon as one is full and what
// there is every Interval, until ctx is done; then it returns nil. An
// export under way when ctx ends finishes (bounded by Timeout). Spans
// ended after Run returns wait for Flush.
func (t *Tracer) Run(ctx context.Context) error {
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-t.wake:
		}
		_ = t.Flush(context.WithoutCancel(ctx))
	}
}

// Flush exports every span queued now, in batches, each bounded by
// Timeout and by ctx; it returns the first export error. Spans a failed
// export carried are dropped and counted.
func (t *Tracer) Flush(ctx context.Context) error {
	t.exportMu.Lock()
	defer t.exportMu.Unlock()
	t.mu.Lock()
	all := t.pending
	t.pending = t.spare
	t.mu.Unlock()
	var first error
	for spans := all; len(spans) > 0; {
		n := min(len(spans), t.cfg.BatchSize)
		if err := t.export(ctx, spans[:n]); err != nil && first == nil {
			first = err
		}
		spans = spans[n:]
	}
	// The spans' attributes are not kept alive until the next round.
	clear(all)
	t.spare = all[:0]
	return first
}

// export posts one batch. Unlike the SDK's exporter it writes the
// protobuf straight from the spans into buffers it reuses.
func (t *Tracer) export(ctx context.Context, spans []Span) error {
	body := t.encode(spans)
	if t.cfg.Gzip {
		t.zbuf.Reset()
		if t.zw == nil {
			t.zw = gzip.NewWriter(&t.zbuf)
		} else {
			t.zw.Reset(&t.zbuf)
		}
		_, _ = t.zw.Write(body)
		_ = t.zw.Close()
		body = t.zbuf.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	err := t.post(ctx, body)
	if err != nil {
		t.lost.Add(float64(len(spans)))
		t.failed++
		if now := time.Now(); now.Sub(t.loggedAt) >= time.Minute {
			t.log.Warn("spans not exported", "endpoint", redact(t.cfg.Endpoint), "spans", len(spans), "failed_exports", t.failed, "err", err)
			t.loggedAt, t.failed = now, 0
		}
		return err
	}
	t.exported.Add(float64(len(spans)))
	return nil
}

// retryable are the answers OTLP/HTTP says to retry.
func retryable(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// post sends body until the collector takes it, retrying a transport
// error or a retryable answer with a growing pause (or the Retry-After it
// asks for) until ctx ends.
func (t *Tracer) post(ctx context.Context, body []byte) error {
	pause := 100 * time.Millisecond
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.cfg.Endpoint, bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("tracing: export: %w", err)
		}
		req.Header.Set("Content-Type", "application/x-protobuf")
		if t.cfg.Gzip {
			req.Header.Set("Content-Encoding", "gzip")
		}
		for k, v := range t.cfg.Headers {
			req.Header.Set(k, v)
		}
		resp, err := t.client.Do(req)
		if err == nil {
			// The answer is a partial success at most; read a bounded part
			// so the connection is reused.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
			err = fmt.Errorf("tracing: export: the collector answered %s", resp.Status)
			if !retryable(resp.StatusCode) {
				return err
			}
			if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
				pause = time.Duration(s) * time.Second
			}
		} else if ctx.Err() != nil {
			return fmt.Errorf("tracing: export: %w", err)
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("tracing: export: %w (last: %w)", ctx.Err(), err)
		case <-timer.C:
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// redact drops the user info and query of an endpoint for the log.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}
