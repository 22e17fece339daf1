package lane

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracectx"
)

// TestStartSpans: the spans of one delivery share one attribute array;
// each gets its own attributes (the intake no attempt, the attempt its
// outcome), its times, and only the queue span the link to the submitter.
func TestStartSpans(t *testing.T) {
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	stored := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	enqueued, now, end := stored.Add(-time.Second), stored.Add(time.Second), stored.Add(2*time.Second)
	job := queue.Job{ID: "j1", Lane: "demo", Key: "k1", Trace: tracectx.Context{Parent: parent, State: "rojo=1"}}

	for _, step := range []struct {
		name     string
		enqueued time.Time
		spans    []string
	}{
		{"published on NATS, first delivery", enqueued, []string{"throttler.intake", "throttler.queue", "throttler.dispatch"}},
		{"a later attempt", time.Time{}, []string{"throttler.queue", "throttler.dispatch"}},
	} {
		t.Run(step.name, func(t *testing.T) {
			rec.Reset()
			tr := startSpans(context.Background(), tp.Tracer(TracerName), job, 2, step.enqueued, stored, now)
			tr.end(dispatch.Result{Verdict: dispatch.Retry, Status: http.StatusServiceUnavailable}, end)
			got := rec.Ended()
			if len(got) != len(step.spans) {
				t.Fatalf("%d spans ended, want %v", len(got), step.spans)
			}
			d := got[len(got)-1]
			if want := "00-0af7651916cd43dd8448eb211c80319c-" + d.SpanContext().SpanID().String() + "-01"; tr.out.Parent != want || tr.out.State != "rojo=1" {
				t.Errorf("target's trace context %+v, want parent %s and the tracestate", tr.out, want)
			}
			for i, s := range got {
				if s.Name() != step.spans[i] {
					t.Fatalf("span %d is %s, want %s", i, s.Name(), step.spans[i])
				}
				if s.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || s.Parent().SpanID().String() != "b7ad6b7169203331" {
					t.Errorf("%s: parent %v, want the submitter's span", s.Name(), s.Parent())
				}
				attrs := attribute.NewSet(s.Attributes()...)
				want := map[attribute.Key]string{AttrLane: "demo", AttrKey: "k1", AttrJobID: "j1"}
				var start, stop time.Time
				var kind trace.SpanKind
				switch s.Name() {
				case "throttler.intake":
					want[AttrIntake], start, stop, kind = "nats", enqueued, enqueued, trace.SpanKindConsumer
				case "throttler.queue":
					want[AttrAttempt], start, stop, kind = "2", stored, now, trace.SpanKindInternal
				case "throttler.dispatch":
					want[AttrAttempt], want[AttrOutcome], want[AttrStatus], start, stop, kind = "2", "retry", "503", now, end, trace.SpanKindClient
				}
				if attrs.Len() != len(want) {
					t.Errorf("%s: attributes %v, want %v", s.Name(), s.Attributes(), want)
				}
				for k, v := range want {
					if got, ok := attrs.Value(k); !ok || got.String() != v {
						t.Errorf("%s: %s = %q, want %q", s.Name(), k, got.String(), v)
					}
				}
				if !s.StartTime().Equal(start) || !s.EndTime().Equal(stop) || s.SpanKind() != kind {
					t.Errorf("%s: %v from %v to %v, want %v from %v to %v", s.Name(), s.SpanKind(), s.StartTime(), s.EndTime(), kind, start, stop)
				}
				links := 0
				if s.Name() == "throttler.queue" {
					links = 1
				}
				if len(s.Links()) != links || (links == 1 && s.Links()[0].SpanContext.SpanID().String() != "b7ad6b7169203331") {
					t.Errorf("%s: links %v, want %d to the submitter's span", s.Name(), s.Links(), links)
				}
			}
		})
	}
}

// TestStartSpansNotSampled: a job whose submitter's span is not sampled
// records nothing; its target still gets a span id of its own in the
// submitter's trace, flagged not sampled.
func TestStartSpansNotSampled(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	now := time.Now()
	job := queue.Job{ID: "j1", Lane: "demo", Trace: tracectx.Context{Parent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}}
	tr := startSpans(context.Background(), tp.Tracer(TracerName), job, 1, now, now, now)
	tr.end(dispatch.Result{Verdict: dispatch.Done, Status: http.StatusOK}, now)
	if n, m := len(rec.Started()), len(rec.Ended()); n != 0 || m != 0 {
		t.Errorf("%d spans started, %d ended; want none", n, m)
	}
	sid := trace.SpanContextFromContext(tr.ctx).SpanID().String()
	if want := "00-0af7651916cd43dd8448eb211c80319c-" + sid + "-00"; tr.out.Parent != want || sid == "b7ad6b7169203331" {
		t.Errorf("target's traceparent %q, want %q (a span id of the throttler's)", tr.out.Parent, want)
	}
}

// TestStartSpansWithoutTrace: the spans of a job that came without a
// traceparent share one trace: the first (the intake of a job published on
// NATS, or else the queue span) is its root, the later ones its children.
func TestStartSpansWithoutTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	now := time.Now()
	job := queue.Job{ID: "j1", Lane: "demo"}
	for _, step := range []struct {
		name     string
		enqueued time.Time
		spans    []string
	}{
		{"first delivery of a job published on NATS", now, []string{"throttler.intake", "throttler.queue", "throttler.dispatch"}},
		{"a later attempt", time.Time{}, []string{"throttler.queue", "throttler.dispatch"}},
	} {
		t.Run(step.name, func(t *testing.T) {
			rec.Reset()
			tr := startSpans(context.Background(), tp.Tracer(TracerName), job, 1, step.enqueued, now, now)
			tr.end(dispatch.Result{Verdict: dispatch.Done, Status: http.StatusOK}, now)
			got := rec.Ended()
			if len(got) != len(step.spans) {
				t.Fatalf("%d spans ended, want %v", len(got), step.spans)
			}
			root := got[0]
			if root.Name() != step.spans[0] || root.Parent().IsValid() {
				t.Fatalf("first span %s with parent %v, want %s as the root", root.Name(), root.Parent(), step.spans[0])
			}
			for i, s := range got[1:] {
				if s.Name() != step.spans[i+1] || s.Parent().SpanID() != root.SpanContext().SpanID() || s.SpanContext().TraceID() != root.SpanContext().TraceID() {
					t.Errorf("%s: parent %v in trace %v, want a child of %s", s.Name(), s.Parent(), s.SpanContext().TraceID(), root.Name())
				}
			}
			d := got[len(got)-1]
			if want := "00-" + d.SpanContext().TraceID().String() + "-" + d.SpanContext().SpanID().String() + "-01"; tr.out.Parent != want {
				t.Errorf("target's traceparent %q, want %q", tr.out.Parent, want)
			}
		})
	}
}
