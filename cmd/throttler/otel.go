package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/tracing"
)

// OpenTelemetry tracing, configured by the standard OTEL_* environment
// variables (docs/CONFIG.md, "OpenTelemetry"). It is off unless one of them
// turns it on: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with
// OTEL_TRACES_EXPORTER unset. OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none keep it off whatever else is set. Off, no
// provider, exporter or span exists; jobs' W3C trace context still travels
// from submitter to target.
//
// The exporter (internal/tracing) is OTLP over HTTP with binary protobuf
// (a collector takes it on port 4318); the gRPC protocol is refused at
// start with the variable named.

// tracingShutdownTimeout bounds the flush of the spans still buffered at a
// stop.
const tracingShutdownTimeout = 5 * time.Second

// envError names the environment variable whose value is refused; it reads
// like a config error.
func envError(name, format string, args ...any) error {
	return &config.Error{Field: name, Msg: fmt.Sprintf(format, args...) + " (environment)"}
}

// tracingConfig is what the OTEL_* variables say.
type tracingConfig struct {
	on          bool
	endpoint    string // the full URL spans are posted to
	headers     map[string]string
	timeout     time.Duration
	tls         *tls.Config // nil: the system's roots, no client certificate
	queueSize   int
	batchSize   int
	interval    time.Duration
	gzip        bool
	sampler     tracing.Sampler
	samplerName string
	resource    []tracing.Attr
}

// firstEnv is the first of names set, and which it was.
func firstEnv(getenv func(string) string, names ...string) (value, name string) {
	for _, n := range names {
		if v := strings.TrimSpace(getenv(n)); v != "" {
			return v, n
		}
	}
	return "", names[len(names)-1]
}

// readTracing reads the OTEL_* variables through getenv; an error names
// the variable it refuses.
func readTracing(getenv func(string) string, b metrics.Build) (tracingConfig, error) {
	var c tracingConfig
	if v := strings.TrimSpace(getenv("OTEL_SDK_DISABLED")); v != "" {
		off, err := strconv.ParseBool(v)
		if err != nil {
			return c, envError("OTEL_SDK_DISABLED", "%q is not true or false", v)
		}
		if off {
			return c, nil
		}
	}
	endpoint, endpointVar := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "":
		c.on = endpoint != ""
	case "otlp":
		c.on = true
	case "none":
		c.on = false
	default:
		return c, envError("OTEL_TRACES_EXPORTER", "%q is not supported: otlp or none", exp)
	}
	if !c.on {
		return c, nil
	}
	if p, name := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
		return c, envError(name, "%q is not supported: the exporter speaks http/protobuf (OTLP over HTTP, port 4318)", p)
	}
	switch {
	case endpoint == "":
		c.endpoint = "http://localhost:4318/v1/traces"
	case endpointVar == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
		c.endpoint = endpoint
	default:
		c.endpoint = strings.TrimRight(endpoint, "/") + "/v1/traces"
	}
	if u, err := url.Parse(c.endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, envError(endpointVar, "%q is not an http or https URL", endpoint)
	}
	if h, name := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"); h != "" {
		kv, err := parseKeyValues(h)
		if err != nil {
			return c, envError(name, "%v", err)
		}
		c.headers = kv
	}
	if t, name := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"); t != "" {
		ms, err := strconv.ParseInt(t, 10, 64)
		if err != nil || ms <= 0 {
			return c, envError(name, "%q is not a positive number of milliseconds", t)
		}
		c.timeout = time.Duration(ms) * time.Millisecond
	}
	if z, name := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"); z != "" {
		switch z {
		case "gzip":
			c.gzip = true
		case "none":
		default:
			return c, envError(name, "%q is not gzip or none", z)
		}
	}
	var err error
	if c.tls, err = readTLS(getenv); err != nil {
		return c, err
	}
	if err := readBatching(getenv, &c); err != nil {
		return c, err
	}
	if c.sampler, c.samplerName, err = readSampler(getenv); err != nil {
		return c, err
	}
	attrs := map[string]string{}
	if ra := strings.TrimSpace(getenv("OTEL_RESOURCE_ATTRIBUTES")); ra != "" {
		if attrs, err = parseKeyValues(ra); err != nil {
			return c, envError("OTEL_RESOURCE_ATTRIBUTES", "%v", err)
		}
	}
	if name := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); name != "" {
		attrs["service.name"] = name
	}
	if attrs["service.name"] == "" {
		attrs["service.name"] = "throttler"
	}
	if attrs["service.version"] == "" {
		attrs["service.version"] = b.Version
	}
	for k, v := range attrs {
		c.resource = append(c.resource, tracing.String(k, v))
	}
	return c, nil
}

// readMillis reads a positive number of milliseconds from the variable
// name; 0 when it is unset.
func readMillis(getenv func(string) string, name string) (time.Duration, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 || ms > int64(time.Hour/time.Millisecond) {
		return 0, envError(name, "%q is not a number of milliseconds from 1 to 3600000", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// readBatching reads the batch span processor's variables (OTEL_BSP_*).
// OTEL_BSP_EXPORT_TIMEOUT and the exporter's timeout both bound one
// export: the smaller wins.
func readBatching(getenv func(string) string, c *tracingConfig) error {
	var err error
	if c.interval, err = readMillis(getenv, "OTEL_BSP_SCHEDULE_DELAY"); err != nil {
		return err
	}
	bsp, err := readMillis(getenv, "OTEL_BSP_EXPORT_TIMEOUT")
	if err != nil {
		return err
	}
	if bsp > 0 && (c.timeout == 0 || bsp < c.timeout) {
		c.timeout = bsp
	}
	for _, v := range []struct {
		name string
		to   *int
	}{{"OTEL_BSP_MAX_QUEUE_SIZE", &c.queueSize}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &c.batchSize}} {
		s := strings.TrimSpace(getenv(v.name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > maxTraceQueue {
			return envError(v.name, "%q is not a number from 1 to %d", s, maxTraceQueue)
		}
		*v.to = n
	}
	if c.queueSize > 0 && c.batchSize > c.queueSize {
		return envError("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "%d is over OTEL_BSP_MAX_QUEUE_SIZE (%d)", c.batchSize, c.queueSize)
	}
	return nil
}

// maxTraceQueue bounds OTEL_BSP_MAX_QUEUE_SIZE: a span takes about 200
// bytes in the queue, so a million of them 200 MB.
const maxTraceQueue = 1 << 20

// readTLS reads the TLS files of an https endpoint: the CA certificates
// to trust instead of the system's (OTEL_EXPORTER_OTLP_CERTIFICATE), and
// a client certificate and key (…_CLIENT_CERTIFICATE, …_CLIENT_KEY), each
// the _TRACES_ variable first. An unreadable file is refused with its
// variable named.
func readTLS(getenv func(string) string) (*tls.Config, error) {
	ca, caVar := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
	cert, certVar := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")
	key, keyVar := firstEnv(getenv, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, envError(caVar, "%v", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, envError(caVar, "%s holds no PEM certificate", ca)
		}
	}
	switch {
	case cert != "" && key != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, envError(certVar, "with %s: %v", keyVar, err)
		}
		c.Certificates = []tls.Certificate{pair}
	case cert != "": // the key named alike is missing
		return nil, envError(strings.Replace(certVar, "CLIENT_CERTIFICATE", "CLIENT_KEY", 1), "is needed with %s", certVar)
	case key != "":
		return nil, envError(strings.Replace(keyVar, "CLIENT_KEY", "CLIENT_CERTIFICATE", 1), "is needed with %s", keyVar)
	}
	return c, nil
}

// readSampler reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG; the
// default follows the submitter's sampling decision (parentbased_always_on).
func readSampler(getenv func(string) string) (tracing.Sampler, string, error) {
	name := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER"))
	if name == "" {
		name = "parentbased_always_on"
	}
	ratio := 1.0
	if strings.HasSuffix(name, "traceidratio") {
		if a := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")); a != "" {
			r, err := strconv.ParseFloat(a, 64)
			if err != nil || r < 0 || r > 1 {
				return tracing.Sampler{}, "", envError("OTEL_TRACES_SAMPLER_ARG", "%q is not a ratio from 0 to 1", a)
			}
			ratio = r
		}
	}
	switch name {
	case "always_on":
		return tracing.Sampler{Ratio: 1}, name, nil
	case "always_off":
		return tracing.Sampler{}, name, nil
	case "traceidratio":
		return tracing.Sampler{Ratio: ratio}, name, nil
	case "parentbased_always_on":
		return tracing.Sampler{Ratio: 1, FollowParent: true}, name, nil
	case "parentbased_always_off":
		return tracing.Sampler{FollowParent: true}, name, nil
	case "parentbased_traceidratio":
		return tracing.Sampler{Ratio: ratio, FollowParent: true}, name, nil
	}
	return tracing.Sampler{}, "", envError("OTEL_TRACES_SAMPLER", "%q is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio", name)
}

// parseKeyValues reads the OTEL list form "k1=v1,k2=v2", values
// percent-encoded.
func parseKeyValues(s string) (map[string]string, error) {
	out := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", strings.TrimSpace(part))
		}
		dv, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("the value of %q is not percent-encoded correctly", k)
		}
		out[k] = dv
	}
	return out, nil
}

// openTracing builds the tracer the OTEL_* variables ask for and starts
// its exports; nil (and a stop that does nothing) when tracing is off.
// stop ends the exports and flushes what is left, bounded by
// tracingShutdownTimeout: call it after the last delivery.
func openTracing(getenv func(string) string, b metrics.Build, logger *slog.Logger, reg prometheus.Registerer) (tr *tracing.Tracer, stop func(), err error) {
	c, err := readTracing(getenv, b)
	if err != nil || !c.on {
		return nil, func() {}, err
	}
	log := logger.With("component", "otel")
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if c.tls != nil {
		transport.TLSClientConfig = c.tls
	}
	tr, err = tracing.New(tracing.Config{
		Endpoint: c.endpoint, Headers: c.headers, Timeout: c.timeout, Gzip: c.gzip,
		Sampler: c.sampler, Resource: c.resource, Logger: log, Registry: reg,
		QueueSize: c.queueSize, BatchSize: c.batchSize, Interval: c.interval,
		Client: &http.Client{Transport: transport},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("opentelemetry: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tr.Run(ctx)
	}()
	log.Info("tracing on: spans are exported over OTLP/HTTP", "endpoint", config.RedactURL(c.endpoint), "sampler", c.samplerName)
	return tr, func() {
		cancel()
		<-done
		sctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
		defer cancel()
		if err := tr.Flush(sctx); err != nil {
			log.Warn("flushing the last spans failed", "err", err)
		}
	}, nil
}
