package tracing_test

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// client is an HTTP client whose connections end with each request, so no
// transport goroutine outlives a test.
func client() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

var (
	tid    = tracectx.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c}
	sid    = tracectx.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31}
	remote = tracectx.SpanContext{TraceID: tid, SpanID: sid, Flags: 1, State: "rojo=1", Remote: true}
)

// TestExportDecodes: what the tracer posts is an OTLP
// ExportTraceServiceRequest the OTLP message types decode to the spans
// made: ids, parent, tracestate, name, kind, times, string and integer
// attributes, link, error status, flags, the resource and the scope; with
// gzip and the configured headers too.
func TestExportDecodes(t *testing.T) {
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[gz], func(t *testing.T) {
			var mu sync.Mutex
			var got []*tracepb.ResourceSpans
			var hdr http.Header
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var body io.Reader = r.Body
				if r.Header.Get("Content-Encoding") == "gzip" {
					zr, err := gzip.NewReader(r.Body)
					if err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
					body = zr
				}
				b, _ := io.ReadAll(body)
				rs, err := testenv.DecodeExport(b)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				mu.Lock()
				got, hdr = append(got, rs...), r.Header.Clone()
				mu.Unlock()
			}))
			defer srv.Close()
			tr, err := tracing.New(tracing.Config{Endpoint: srv.URL + "/v1/traces", Gzip: gz, Client: client(),
				Headers:  map[string]string{"Authorization": "Bearer x"},
				Sampler:  tracing.DefaultSampler,
				Resource: []tracing.Attr{tracing.String("service.version", "v1"), tracing.String("service.name", "thr")}})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
			s := tr.Start(remote, "throttler.queue", tracing.KindInternal, t0)
			s.Attrs = []tracing.Attr{tracing.String("throttler.lane", "demo"), tracing.Int("throttler.attempt", 3), tracing.Int("neg", -2)}
			s.Link = remote
			s.Error, s.ErrorMsg = true, "target answered 503"
			tr.End(&s, t0.Add(time.Second))
			c := tr.Start(s.Context, "child", tracing.KindClient, t0)
			tr.End(&c, t0)
			if err := tr.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if hdr.Get("Content-Type") != "application/x-protobuf" || hdr.Get("Authorization") != "Bearer x" || (hdr.Get("Content-Encoding") == "gzip") != gz {
				t.Errorf("headers %v", hdr)
			}
			if len(got) != 1 || len(got[0].ScopeSpans) != 1 || len(got[0].ScopeSpans[0].Spans) != 2 {
				t.Fatalf("request %v, want one resource, one scope, two spans", got)
			}
			res := got[0].Resource.Attributes
			if len(res) != 2 || res[0].Key != "service.name" || res[0].Value.GetStringValue() != "thr" || res[1].Value.GetStringValue() != "v1" {
				t.Errorf("resource %v, want service.name and service.version in key order", res)
			}
			if sc := got[0].ScopeSpans[0].Scope; sc.Name != tracing.DefaultScope {
				t.Errorf("scope %v", sc)
			}
			p, ch := got[0].ScopeSpans[0].Spans[0], got[0].ScopeSpans[0].Spans[1]
			if tracectx.TraceID(p.TraceId) != tid || tracectx.SpanID(p.SpanId) != s.Context.SpanID || tracectx.SpanID(p.ParentSpanId) != sid ||
				p.TraceState != "rojo=1" || p.Name != "throttler.queue" || p.Kind != tracepb.Span_SPAN_KIND_INTERNAL ||
				p.StartTimeUnixNano != uint64(t0.UnixNano()) || p.EndTimeUnixNano != uint64(t0.Add(time.Second).UnixNano()) || p.Flags != 0x301 {
				t.Errorf("span %v", p)
			}
			if len(p.Attributes) != 3 || p.Attributes[0].Value.GetStringValue() != "demo" || p.Attributes[1].Value.GetIntValue() != 3 || p.Attributes[2].Value.GetIntValue() != -2 {
				t.Errorf("attributes %v", p.Attributes)
			}
			if len(p.Links) != 1 || tracectx.SpanID(p.Links[0].SpanId) != sid || tracectx.TraceID(p.Links[0].TraceId) != tid || p.Links[0].TraceState != "rojo=1" || p.Links[0].Flags != 0x301 {
				t.Errorf("links %v", p.Links)
			}
			if p.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || p.Status.GetMessage() != "target answered 503" {
				t.Errorf("status %v", p.Status)
			}
			if tracectx.SpanID(ch.ParentSpanId) != s.Context.SpanID || tracectx.TraceID(ch.TraceId) != tid || ch.Flags != 0x101 || ch.Status != nil || len(ch.Links) != 0 {
				t.Errorf("child %v, want a local child of %v", ch, p)
			}
		})
	}
}

// TestSampler: the standard samplers' decisions, parent first.
func TestSampler(t *testing.T) {
	low := tracectx.TraceID{15: 0x02}                                               // the lowest ids: in any share above 0
	high := tracectx.TraceID{8: 0xff, 9: 0xff, 10: 0xff, 11: 0xff, 12: 0xff, 15: 1} // in no share below 1
	sampled := tracectx.SpanContext{TraceID: low, SpanID: sid, Flags: 1}
	unsampled := tracectx.SpanContext{TraceID: high, SpanID: sid}
	none := tracectx.SpanContext{}
	tr := func(s tracing.Sampler) *tracing.Tracer {
		tr, err := tracing.New(tracing.Config{Endpoint: "http://127.0.0.1:1/v1/traces", Sampler: s})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	for _, step := range []struct {
		name    string
		sampler tracing.Sampler
		parent  tracectx.SpanContext
		want    bool
	}{
		{"parentbased_always_on, sampled parent", tracing.DefaultSampler, sampled, true},
		{"parentbased_always_on, parent not sampled", tracing.DefaultSampler, unsampled, false},
		{"parentbased_always_on, root", tracing.DefaultSampler, none, true},
		{"parentbased_always_off, sampled parent", tracing.Sampler{FollowParent: true}, sampled, true},
		{"parentbased_always_off, root", tracing.Sampler{FollowParent: true}, none, false},
		{"always_on, parent not sampled", tracing.Sampler{Ratio: 1}, unsampled, true},
		{"always_off, sampled parent", tracing.Sampler{}, sampled, false},
		{"traceidratio 0.5, low id", tracing.Sampler{Ratio: 0.5}, sampled, true},
		{"traceidratio 0.5, high id", tracing.Sampler{Ratio: 0.5}, tracectx.SpanContext{TraceID: high, SpanID: sid, Flags: 1}, false},
		{"parentbased_traceidratio, parent not sampled, low id", tracing.Sampler{Ratio: 0.5, FollowParent: true}, tracectx.SpanContext{TraceID: low, SpanID: sid}, false},
	} {
		t.Run(step.name, func(t *testing.T) {
			s := tr(step.sampler).Start(step.parent, "s", tracing.KindInternal, time.Time{})
			if s.Sampled() != step.want {
				t.Errorf("sampled %v, want %v", s.Sampled(), step.want)
			}
			if step.parent.IsValid() && (s.Context.TraceID != step.parent.TraceID || s.Parent != step.parent.SpanID || s.Context.SpanID == step.parent.SpanID) {
				t.Errorf("span %+v is not a child of %+v", s.Context, step.parent)
			}
			if !step.parent.IsValid() && (!s.Context.IsValid() || s.Parent != (tracectx.SpanID{})) {
				t.Errorf("root %+v, want new ids and no parent", s)
			}
		})
	}
	// The share of roots a ratio sampler takes is the ratio.
	r := tr(tracing.Sampler{Ratio: 0.25})
	n := 0
	for range 20000 {
		if s := r.Start(none, "s", tracing.KindInternal, time.Time{}); s.Sampled() {
			n++
		}
	}
	if n < 4500 || n > 5500 {
		t.Errorf("traceidratio 0.25 sampled %d roots of 20000", n)
	}
}

// TestQueueFullDropsAndCounts: a span ended while the queue is full is
// dropped and counted, and End does not wait; a span not sampled is never
// queued.
func TestQueueFullDropsAndCounts(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { posts.Add(1) }))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	tr, err := tracing.New(tracing.Config{Endpoint: srv.URL, QueueSize: 4, Sampler: tracing.DefaultSampler, Registry: reg, Client: client()})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		s := tr.Start(remote, "s", tracing.KindInternal, time.Time{})
		tr.End(&s, time.Time{})
		u := tr.Start(tracectx.SpanContext{TraceID: tid, SpanID: sid}, "u", tracing.KindInternal, time.Time{})
		tr.End(&u, time.Time{})
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, reg, "throttler_trace_spans_dropped_total", "queue_full"); got != 6 {
		t.Errorf("dropped %v, want 6", got)
	}
	if got := counter(t, reg, "throttler_trace_spans_exported_total", ""); got != 4 || posts.Load() != 1 {
		t.Errorf("exported %v spans in %d posts, want 4 in 1", got, posts.Load())
	}
}

// counter is the value of a counter, of its series with the reason label
// when reason is set.
func counter(t *testing.T, g prometheus.Gatherer, name, reason string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == reason) {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// TestExportRetriesAndGivesUp: a 503 is retried until the collector takes
// the batch; a 400 is not retried, and its spans are counted lost; a
// collector that never answers costs an export its Timeout, no more.
func TestExportRetriesAndGivesUp(t *testing.T) {
	var calls atomic.Int64
	answers := []int{http.StatusServiceUnavailable, http.StatusOK, http.StatusBadRequest}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(answers[min(int(calls.Add(1))-1, len(answers)-1)])
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	tr, err := tracing.New(tracing.Config{Endpoint: srv.URL, Sampler: tracing.DefaultSampler, Registry: reg, Client: client()})
	if err != nil {
		t.Fatal(err)
	}
	end := func() {
		s := tr.Start(remote, "s", tracing.KindInternal, time.Time{})
		tr.End(&s, time.Time{})
	}
	end()
	if err := tr.Flush(context.Background()); err != nil || calls.Load() != 2 {
		t.Fatalf("after a 503: %v in %d posts, want success in 2", err, calls.Load())
	}
	end()
	if err := tr.Flush(context.Background()); err == nil || calls.Load() != 3 {
		t.Fatalf("after a 400: %v in %d posts, want an error after 1 more", err, calls.Load())
	}
	if got := counter(t, reg, "throttler_trace_spans_dropped_total", "export_failed"); got != 1 {
		t.Errorf("lost %v, want 1", got)
	}

	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	defer slow.Close()
	defer close(hang)
	tr, err = tracing.New(tracing.Config{Endpoint: slow.URL, Timeout: 100 * time.Millisecond, Sampler: tracing.DefaultSampler, Client: client()})
	if err != nil {
		t.Fatal(err)
	}
	end()
	if err := tr.Flush(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a collector that never answers: %v, want the timeout", err)
	}
}

// TestRunExportsFullBatches: Run exports a batch as soon as it is full,
// without waiting for the interval, and stops with its context.
func TestRunExportsFullBatches(t *testing.T) {
	recv := testenv.StartOTLP(t)
	tr, err := tracing.New(tracing.Config{Endpoint: recv.URL + "/v1/traces", BatchSize: 3, Interval: time.Hour, Sampler: tracing.DefaultSampler, Client: client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	for range 3 {
		s := tr.Start(remote, "s", tracing.KindInternal, time.Time{})
		tr.End(&s, time.Time{})
	}
	testenv.Eventually(t, 10*time.Second, "the full batch exported", func() bool { return len(recv.Spans()) == 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesBadEndpoint: the endpoint must be an http or https URL.
func TestNewRefusesBadEndpoint(t *testing.T) {
	for _, e := range []string{"", "collector:4318", "ftp://c/v1/traces", "http:///v1/traces"} {
		if _, err := tracing.New(tracing.Config{Endpoint: e}); !errors.Is(err, tracing.ErrConfig) {
			t.Errorf("%q: %v, want ErrConfig", e, err)
		}
	}
}

// TestContextCarriesSpan: ContextWith and FromContext round-trip.
func TestContextCarriesSpan(t *testing.T) {
	if tracing.FromContext(context.Background()).IsValid() {
		t.Fatal("an empty context carries a span")
	}
	if got := tracing.FromContext(tracing.ContextWith(context.Background(), remote)); got != remote {
		t.Fatalf("got %+v", got)
	}
}
