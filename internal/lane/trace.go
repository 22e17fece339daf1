package lane

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracectx"
)

// Trace context and spans of a delivery.
//
// Every delivery carries the job's stored W3C trace context to its target.
// With tracing off (Deps.Traces nil) it is the submitter's own, so the
// target's span is a child of the submitter's. With tracing on, the lane
// makes, in the submitter's trace (or a trace of its own for a job that
// came without one, whose first span is its root):
//
//   - throttler.intake, for a job published on NATS, when the drain first
//     meets it: a point at the time JetStream stored it;
//   - throttler.queue, the wait from the store of this copy of the job to
//     its start, a child of the submitter's span linked to it;
//   - throttler.dispatch, one per attempt, a child of the submitter's span,
//     whose id the target receives as its parent.
//
// Attributes: the lane, the key (at most queue.MaxKey bytes), the job id,
// the attempt, and on the attempt its outcome and the target's status.

// TracerName names the throttler's tracer (the instrumentation scope).
const TracerName = "github.com/throttler/throttler"

// Span attribute keys.
const (
	AttrLane    = attribute.Key("throttler.lane")
	AttrKey     = attribute.Key("throttler.key")
	AttrJobID   = attribute.Key("throttler.job.id")
	AttrAttempt = attribute.Key("throttler.attempt")
	AttrOutcome = attribute.Key("throttler.outcome")
	AttrIntake  = attribute.Key("throttler.intake")
	// AttrStatus is the HTTP target's answer (OpenTelemetry's name).
	AttrStatus = attribute.Key("http.response.status_code")
)

// The start options and attributes every delivery's spans share.
var (
	kindConsumer = trace.WithSpanKind(trace.SpanKindConsumer)
	kindInternal = trace.WithSpanKind(trace.SpanKindInternal)
	kindClient   = trace.WithSpanKind(trace.SpanKindClient)
	intakeNATS   = AttrIntake.String("nats")
)

// traced is a started delivery's trace: the context to deliver with (it
// holds the attempt's span) and the trace context the target receives.
type traced struct {
	ctx  context.Context
	out  tracectx.Context
	span trace.Span // nil with tracing off
	// attrs are the attempt's attributes, set with its outcome when it
	// ends: room for the outcome and the status follows them.
	attrs []attribute.KeyValue
}

// traceStart opens the spans of msg's delivery, starting now. A published
// job whose trace headers were dropped is logged once, when the drain
// first meets it.
func (l *Lane) traceStart(ctx context.Context, msg *queue.Msg, job queue.Job, intake bool) traced {
	if intake && job.TraceErr != nil {
		l.log.Warn("trace headers of a job published on NATS ignored", "id", job.ID, "err", job.TraceErr)
	}
	if l.tracer == nil {
		return traced{ctx: ctx, out: job.Trace}
	}
	var enqueued time.Time
	if intake {
		enqueued = msg.EnqueuedAt()
	}
	return startSpans(ctx, l.tracer, job, msg.Attempt(), enqueued, msg.StoredAt(), l.d.Clock.Now())
}

// startSpans makes the spans of one delivery of job with tracer: the
// intake point at enqueued (none for a zero enqueued), the queue wait from
// stored to now, and the attempt's span from now, left open.
//
// With the submitter's span as their parent, the attempt's span is made
// first: when the sampler does not record it, the intake and queue spans
// are not made, since every standard sampler (OTEL_TRACES_SAMPLER) decides
// alike for spans of one trace under one parent. A job that is not
// sampled then costs one unrecorded span, whose id its target still
// receives as its parent.
func startSpans(ctx context.Context, tracer trace.Tracer, job queue.Job, attempt int, enqueued, stored, now time.Time) traced {
	parent := job.Trace.SpanContext()
	if !parent.IsValid() {
		intakeAttrs, jobAttrs := spanAttrs(job, attempt)
		return startRoot(ctx, tracer, job, intakeAttrs, jobAttrs, enqueued, stored, now)
	}
	ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	dctx, d := tracer.Start(ctx, "throttler.dispatch", kindClient, trace.WithTimestamp(now))
	out := traced{ctx: dctx, out: job.Trace.Under(d.SpanContext()), span: d}
	if !d.IsRecording() {
		return out
	}
	intakeAttrs, jobAttrs := spanAttrs(job, attempt)
	out.attrs = jobAttrs
	if !enqueued.IsZero() {
		_, s := tracer.Start(ctx, "throttler.intake", kindConsumer, trace.WithTimestamp(enqueued), trace.WithAttributes(intakeAttrs...))
		s.End(trace.WithTimestamp(enqueued))
	}
	_, q := tracer.Start(ctx, "throttler.queue", kindInternal, trace.WithTimestamp(stored), trace.WithAttributes(jobAttrs...),
		trace.WithLinks(trace.Link{SpanContext: parent}))
	q.End(trace.WithTimestamp(now))
	return out
}

// spanAttrs are the attributes of a delivery's spans, in one array: the
// intake's are its first four, the queue's the next four, and the
// attempt's those and its outcome and status, set when it ends (its
// attributes in one call, with room for the last two). The SDK copies
// them, so they are shared.
func spanAttrs(job queue.Job, attempt int) (intake, spans []attribute.KeyValue) {
	key := job.Key
	if len(key) > queue.MaxKey {
		key = key[:queue.MaxKey]
	}
	attrs := make([]attribute.KeyValue, 5, 7)
	attrs[0], attrs[1], attrs[2], attrs[3], attrs[4] = intakeNATS, AttrLane.String(job.Lane), AttrKey.String(key), AttrJobID.String(job.ID), AttrAttempt.Int(attempt)
	return attrs[:4], attrs[1:5:7]
}

// startRoot makes the spans of a delivery of a job without a trace
// context (published on NATS without a traceparent, or stored while
// tracing was off) in one trace of their own: its first span, the intake
// (or else the queue span), is the root, and the later ones its children.
func startRoot(ctx context.Context, tracer trace.Tracer, job queue.Job, intakeAttrs, jobAttrs []attribute.KeyValue, enqueued, stored, now time.Time) traced {
	var root trace.Span
	if !enqueued.IsZero() {
		ctx, root = tracer.Start(ctx, "throttler.intake", kindConsumer, trace.WithTimestamp(enqueued), trace.WithAttributes(intakeAttrs...))
		root.End(trace.WithTimestamp(enqueued))
		_, q := tracer.Start(ctx, "throttler.queue", kindInternal, trace.WithTimestamp(stored), trace.WithAttributes(jobAttrs...))
		q.End(trace.WithTimestamp(now))
	} else {
		ctx, root = tracer.Start(ctx, "throttler.queue", kindInternal, trace.WithTimestamp(stored), trace.WithAttributes(jobAttrs...))
		root.End(trace.WithTimestamp(now))
	}
	dctx, d := tracer.Start(ctx, "throttler.dispatch", kindClient, trace.WithTimestamp(now))
	return traced{ctx: dctx, out: job.Trace.Under(d.SpanContext()), span: d, attrs: jobAttrs}
}

// end closes the attempt's span with the delivery's outcome.
func (t traced) end(res dispatch.Result, at time.Time) {
	if t.span == nil {
		return
	}
	if !t.span.IsRecording() {
		t.span.End()
		return
	}
	attrs := append(t.attrs, AttrOutcome.String(res.Verdict.String()))
	if res.Status != 0 {
		attrs = append(attrs, AttrStatus.Int(res.Status))
	}
	t.span.SetAttributes(attrs...)
	if res.Verdict != dispatch.Done {
		msg := res.Verdict.String()
		if res.Err != nil {
			msg = res.Err.Error()
		}
		t.span.SetStatus(codes.Error, msg)
	}
	t.span.End(trace.WithTimestamp(at))
}
