package lane

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// exportTo returns a tracer exporting to a new OTLP receiver, and a func
// that flushes it and returns what the receiver decoded: the spans as a
// collector reads them.
func exportTo(t *testing.T) (*tracing.Tracer, func() []testenv.Span) {
	t.Helper()
	recv := testenv.StartOTLP(t)
	tr, err := tracing.New(tracing.Config{Endpoint: recv.URL + "/v1/traces", Sampler: tracing.DefaultSampler,
		Client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return tr, func() []testenv.Span {
		t.Helper()
		if err := tr.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		return recv.Spans()
	}
}

// TestStartSpans: the spans of one delivery share one attribute array;
// each gets its own attributes (the intake no attempt, the attempt its
// outcome), its times, and only the queue span the link to the submitter.
func TestStartSpans(t *testing.T) {
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
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
			tracer, flush := exportTo(t)
			tr := startSpans(tracer, job, 2, step.enqueued, stored, now)
			tr.end(dispatch.Result{Verdict: dispatch.Retry, Status: http.StatusServiceUnavailable}, end)
			got := flush()
			if len(got) != len(step.spans) {
				t.Fatalf("%d spans ended, want %v", len(got), step.spans)
			}
			d := got[len(got)-1]
			if want := "00-0af7651916cd43dd8448eb211c80319c-" + d.SpanID() + "-01"; tr.out.Parent != want || tr.out.State != "rojo=1" {
				t.Errorf("target's trace context %+v, want parent %s and the tracestate", tr.out, want)
			}
			for i, s := range got {
				if s.Name != step.spans[i] {
					t.Fatalf("span %d is %s, want %s", i, s.Name, step.spans[i])
				}
				if s.TraceID() != "0af7651916cd43dd8448eb211c80319c" || s.ParentID() != "b7ad6b7169203331" || s.TraceState != "rojo=1" {
					t.Errorf("%s: trace %s parent %s state %q, want the submitter's span and tracestate", s.Name, s.TraceID(), s.ParentID(), s.TraceState)
				}
				want := map[string]string{AttrLane: "demo", AttrKey: "k1", AttrJobID: "j1"}
				var start, stop time.Time
				var kind tracepb.Span_SpanKind
				switch s.Name {
				case "throttler.intake":
					want[AttrIntake], start, stop, kind = "nats", enqueued, enqueued, tracepb.Span_SPAN_KIND_CONSUMER
				case "throttler.queue":
					want[AttrAttempt], start, stop, kind = "2", stored, now, tracepb.Span_SPAN_KIND_INTERNAL
				case "throttler.dispatch":
					want[AttrAttempt], want[AttrOutcome], want[AttrStatus], start, stop, kind = "2", "retry", "503", now, end, tracepb.Span_SPAN_KIND_CLIENT
				}
				if len(s.Attributes) != len(want) {
					t.Errorf("%s: attributes %v, want %v", s.Name, s.Attributes, want)
				}
				for k, v := range want {
					if got := s.Attr(k); got != v {
						t.Errorf("%s: %s = %q, want %q", s.Name, k, got, v)
					}
				}
				if s.StartTimeUnixNano != uint64(start.UnixNano()) || s.EndTimeUnixNano != uint64(stop.UnixNano()) || s.Kind != kind {
					t.Errorf("%s: %v from %d to %d, want %v from %v to %v", s.Name, s.Kind, s.StartTimeUnixNano, s.EndTimeUnixNano, kind, start, stop)
				}
				links := 0
				if s.Name == "throttler.queue" {
					links = 1
				}
				if len(s.Links) != links || (links == 1 && (tracectx.SpanID(s.Links[0].SpanId) != tracectx.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31} || s.Links[0].TraceState != "rojo=1")) {
					t.Errorf("%s: links %v, want %d to the submitter's span", s.Name, s.Links, links)
				}
				wantErr := s.Name == "throttler.dispatch"
				if (s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR) != wantErr {
					t.Errorf("%s: status %v, error wanted: %v", s.Name, s.Status, wantErr)
				}
				// Sampled, and the parent is remote (the submitter's).
				if s.Flags != 0x301 {
					t.Errorf("%s: flags %#x, want 0x301", s.Name, s.Flags)
				}
			}
		})
	}
}

// TestStartSpansNotSampled: a job whose submitter's span is not sampled
// records nothing; its target still gets a span id of its own in the
// submitter's trace, flagged not sampled.
func TestStartSpansNotSampled(t *testing.T) {
	tracer, flush := exportTo(t)
	now := time.Now()
	job := queue.Job{ID: "j1", Lane: "demo", Trace: tracectx.Context{Parent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}}
	tr := startSpans(tracer, job, 1, now, now, now)
	tr.end(dispatch.Result{Verdict: dispatch.Done, Status: http.StatusOK}, now)
	if got := flush(); len(got) != 0 {
		t.Errorf("%d spans exported; want none", len(got))
	}
	sid := tr.span.Context.SpanID
	if want := tracectx.Format(tr.span.Context.TraceID, sid, 0); tr.out.Parent != want || want[3:35] != "0af7651916cd43dd8448eb211c80319c" || want[36:52] == "b7ad6b7169203331" {
		t.Errorf("target's traceparent %q, want %q (a span id of the throttler's in the submitter's trace)", tr.out.Parent, want)
	}
}

// TestStartSpansWithoutTrace: the spans of a job that came without a
// traceparent share one trace: the first (the intake of a job published on
// NATS, or else the queue span) is its root, the later ones its children.
func TestStartSpansWithoutTrace(t *testing.T) {
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
			tracer, flush := exportTo(t)
			tr := startSpans(tracer, job, 1, step.enqueued, now, now)
			tr.end(dispatch.Result{Verdict: dispatch.Done, Status: http.StatusOK}, now)
			got := flush()
			if len(got) != len(step.spans) {
				t.Fatalf("%d spans ended, want %v", len(got), step.spans)
			}
			root := got[0]
			if root.Name != step.spans[0] || root.ParentID() != "" || root.Flags != 0x101 {
				t.Fatalf("first span %s with parent %q (flags %#x), want %s as the root", root.Name, root.ParentID(), root.Flags, step.spans[0])
			}
			for i, s := range got[1:] {
				if s.Name != step.spans[i+1] || s.ParentID() != root.SpanID() || s.TraceID() != root.TraceID() || s.Flags != 0x101 {
					t.Errorf("%s: parent %s in trace %s (flags %#x), want a local child of %s", s.Name, s.ParentID(), s.TraceID(), s.Flags, root.Name)
				}
			}
			d := got[len(got)-1]
			if want := "00-" + d.TraceID() + "-" + d.SpanID() + "-01"; tr.out.Parent != want {
				t.Errorf("target's traceparent %q, want %q", tr.out.Parent, want)
			}
			if d.Attr(AttrAttempt) != strconv.Itoa(1) || d.Attr(AttrOutcome) != "done" {
				t.Errorf("attempt span attributes %v", d.Attributes)
			}
		})
	}
}
