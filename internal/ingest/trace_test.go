package ingest

import (
	"context"
	"net/http"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// TestIntakeSpans (tracing on, spans decoded by an OTLP receiver): a batch
// submitted with a traceparent gets a server span, a child of the
// submitter's span with the route's attributes; an item that came without
// a trace context of its own is stored under the submitter's span, and a
// batch without a traceparent is stored under its intake span, the root
// of a trace of its own. A refused batch's span says so.
func TestIntakeSpans(t *testing.T) {
	const submitter = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	recv := testenv.StartOTLP(t)
	tr, err := tracing.New(tracing.Config{Endpoint: recv.URL + "/v1/traces", Sampler: tracing.DefaultSampler,
		Client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Traces = tr })
	item := `{"idempotency_key":"a","payload":{"n":1}}`
	if rec, _, _ := postBatch(t, f, "demo", `[`+item+`]`, map[string]string{"traceparent": submitter}); rec.Code != http.StatusAccepted {
		t.Fatalf("with a traceparent: %d %s", rec.Code, rec.Body)
	}
	if rec, _, _ := postBatch(t, f, "demo", `[{"idempotency_key":"b","payload":1}]`, nil); rec.Code != http.StatusAccepted {
		t.Fatalf("without: %d %s", rec.Code, rec.Body)
	}
	if rec, _, _ := postBatch(t, f, "demo", `[]`, map[string]string{"traceparent": submitter}); rec.Code != http.StatusBadRequest {
		t.Fatalf("empty batch: %d %s", rec.Code, rec.Body)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := recv.Named("POST /v1/lanes/{lane}/jobs:batch")
	if len(spans) != 3 {
		t.Fatalf("%d intake spans, want 3", len(spans))
	}
	with, without, refused := spans[0], spans[1], spans[2]
	if with.TraceID() != "4bf92f3577b34da6a3ce929d0e0e4736" || with.ParentID() != "00f067aa0ba902b7" || with.Kind != tracepb.Span_SPAN_KIND_SERVER ||
		with.Attr("http.route") != "POST /v1/lanes/{lane}/jobs:batch" || with.Attr("throttler.lane") != "demo" ||
		with.Attr("http.response.status_code") != "202" || with.Attr("throttler.outcome") != "accepted" {
		t.Errorf("intake span %v, want a server span under the submitter's", with.Span)
	}
	if refused.Attr("http.response.status_code") != "400" || refused.Attr("throttler.outcome") != "refused" {
		t.Errorf("refused batch's span attributes %v", refused.Attributes)
	}
	if without.ParentID() != "" {
		t.Errorf("intake span without a traceparent has parent %s, want a root", without.ParentID())
	}
	f.pub.mu.Lock()
	defer f.pub.mu.Unlock()
	if len(f.pub.batched) != 2 {
		t.Fatalf("%d jobs stored, want 2", len(f.pub.batched))
	}
	if got := f.pub.batched[0].Trace.Parent; got != submitter {
		t.Errorf("job with a traceparent stored under %q, want the submitter's %q", got, submitter)
	}
	tid, sid, _, err := tracectx.ParseParent(f.pub.batched[1].Trace.Parent)
	if err != nil || tracectx.SpanID(without.SpanId) != sid || tracectx.TraceID(without.TraceId) != tid {
		t.Errorf("job without one stored under %q, want its intake span %s", f.pub.batched[1].Trace.Parent, without.SpanID())
	}
}
