package main

import (
	"bytes"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// TestReadTracing: which OTEL_* variables turn tracing on, where spans go,
// and the values refused at start with the variable named.
func TestReadTracing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		on       bool
		endpoint string
		timeout  time.Duration
		errVar   string
	}{
		{name: "nothing set: off", env: nil},
		{name: "service name alone: off", env: map[string]string{"OTEL_SERVICE_NAME": "x"}},
		{name: "endpoint turns it on", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, on: true, endpoint: "http://collector:4318/v1/traces"},
		{name: "traces endpoint as is", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4318/custom"}, on: true, endpoint: "https://c:4318/custom"},
		{name: "exporter otlp, default endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true, endpoint: "http://localhost:4318/v1/traces"},
		{name: "the smaller export timeout wins", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "3000", "OTEL_BSP_EXPORT_TIMEOUT": "2000"},
			on: true, endpoint: "http://localhost:4318/v1/traces", timeout: 2 * time.Second},
		{name: "exporter none wins", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{name: "sdk disabled wins", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{name: "exporter zipkin", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, errVar: "OTEL_TRACES_EXPORTER"},
		{name: "grpc refused", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, errVar: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "bad endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, errVar: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "bad sampler", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, errVar: "OTEL_TRACES_SAMPLER"},
		{name: "bad ratio", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, errVar: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "bad timeout", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, errVar: "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{name: "bad headers", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, errVar: "OTEL_EXPORTER_OTLP_HEADERS"},
		{name: "bad disabled", env: map[string]string{"OTEL_SDK_DISABLED": "maybe"}, errVar: "OTEL_SDK_DISABLED"},
		{name: "bad schedule delay", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "5s"}, errVar: "OTEL_BSP_SCHEDULE_DELAY"},
		{name: "bad queue size", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_QUEUE_SIZE": "0"}, errVar: "OTEL_BSP_MAX_QUEUE_SIZE"},
		{name: "batch over queue", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "200"}, errVar: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"},
		{name: "missing CA file", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, errVar: "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{name: "client certificate without key", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/x.pem"}, errVar: "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := readTracing(func(k string) string { return tc.env[k] }, metrics.Build{Version: "v1"})
			if tc.errVar != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.errVar+": ") {
					t.Fatalf("err = %v, want one naming %s", err, tc.errVar)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.on != tc.on || c.endpoint != tc.endpoint {
				t.Fatalf("on %v endpoint %q, want %v %q", c.on, c.endpoint, tc.on, tc.endpoint)
			}
			if tc.timeout != 0 && c.timeout != tc.timeout {
				t.Fatalf("timeout %v, want %v", c.timeout, tc.timeout)
			}
		})
	}
}

// TestServeExportsSpans runs the real binary with OTEL_EXPORTER_OTLP_ENDPOINT
// set to an in-test OTLP/HTTP receiver: a job submitted with a traceparent
// reaches the target in the submitter's trace, and after SIGTERM (the
// provider's flush) the receiver holds the job's spans, under the service
// name OTEL_SERVICE_NAME gave, with the submitter's trace id. A refused
// variable stops the start with its name.
func TestServeExportsSpans(t *testing.T) {
	t.Parallel()
	recv := testenv.StartOTLP(t)
	var mu sync.Mutex
	var got string
	target := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Get("traceparent")
		mu.Unlock()
	}))
	defer target.Close()
	path, addr := procConfig(t, t.TempDir(), "", "", laneYAML{rate: 50, burst: 5, target: target.URL + "/hook"})
	p := startBinaryEnv(t, binary, path, addr, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL, "OTEL_SERVICE_NAME=throttler-test"})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", strings.NewReader("x"))
	req.Header.Set("traceparent", parent)
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %d", resp.StatusCode)
	}
	testenv.Eventually(t, 10*time.Second, "the job delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got != ""
	})
	p.stop()
	mu.Lock()
	sent := got
	mu.Unlock()
	if !strings.HasPrefix(sent, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || sent == parent {
		t.Fatalf("target got traceparent %q, want the submitter's trace under the throttler's attempt span", sent)
	}
	var names []string
	for _, s := range recv.Spans() {
		if s.TraceID() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Service != "throttler-test" {
			continue
		}
		names = append(names, s.Name)
		if s.Name == "throttler.dispatch" && !strings.Contains(sent, "-"+s.SpanID()+"-") {
			t.Errorf("attempt span %s is not the parent the target got (%s)", s.SpanID(), sent)
		}
	}
	for _, want := range []string{"POST /v1/lanes/{lane}/jobs", "throttler.queue", "throttler.dispatch"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Errorf("no %s span in the submitter's trace flushed at stop; got %v", want, names)
		}
	}

	// A refused variable: exit code 1, the variable named.
	cmd := exec.Command(binary, "serve", "--config", path)
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=zipkin")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "OTEL_TRACES_EXPORTER") {
		t.Fatalf("OTEL_TRACES_EXPORTER=zipkin: %v, stderr %q; want exit 1 naming the variable", err, stderr.String())
	}
}

// TestOpenTracingTrustsTheCAFile: with OTEL_EXPORTER_OTLP_CERTIFICATE
// naming the collector's CA, spans reach an https collector the system
// does not trust; without it the export fails.
func TestOpenTracingTrustsTheCAFile(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if rs, err := testenv.DecodeExport(b); err == nil && len(rs) == 1 {
			got.Add(int64(len(rs[0].ScopeSpans[0].Spans)))
		}
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, step := range []struct {
		name string
		env  map[string]string
		want int64
	}{
		{"system roots only", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_TIMEOUT": "500"}, 0},
		{"the CA file", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_CERTIFICATE": ca}, 1},
	} {
		t.Run(step.name, func(t *testing.T) {
			got.Store(0)
			tr, stop, err := openTracing(func(k string) string { return step.env[k] }, metrics.Build{Version: "v1"}, log, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			s := tr.Start(tracectx.SpanContext{}, "s", tracing.KindInternal, time.Now())
			tr.End(&s, time.Now())
			stop()
			if got.Load() != step.want {
				t.Fatalf("the collector got %d spans, want %d", got.Load(), step.want)
			}
		})
	}
}
