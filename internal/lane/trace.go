package lane

import (
	"time"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
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

// Span attribute keys.
const (
	AttrLane    = "throttler.lane"
	AttrKey     = "throttler.key"
	AttrJobID   = "throttler.job.id"
	AttrAttempt = "throttler.attempt"
	AttrOutcome = "throttler.outcome"
	AttrIntake  = "throttler.intake"
	// AttrStatus is the HTTP target's answer (OpenTelemetry's name).
	AttrStatus = "http.response.status_code"
)

var intakeNATS = tracing.String(AttrIntake, "nats")

// traced is a started delivery's trace: the trace context the target
// receives, and the attempt's span (unsampled with tracing off).
type traced struct {
	out    tracectx.Context
	tracer *tracing.Tracer // nil with tracing off
	span   tracing.Span
}

// traceStart opens the spans of msg's delivery, starting now. A published
// job whose trace headers were dropped is logged once, when the drain
// first meets it.
func (l *Lane) traceStart(msg *queue.Msg, job queue.Job, intake bool) traced {
	if intake && job.TraceErr != nil {
		l.log.Warn("trace headers of a job published on NATS ignored", "id", job.ID, "err", job.TraceErr)
	}
	if l.d.Traces == nil {
		return traced{out: job.Trace}
	}
	var enqueued time.Time
	if intake {
		enqueued = msg.EnqueuedAt()
	}
	return startSpans(l.d.Traces, job, msg.Attempt(), enqueued, msg.StoredAt(), l.d.Clock.Now())
}

// startSpans makes the spans of one delivery of job with tracer: the
// intake point at enqueued (none for a zero enqueued), the queue wait from
// stored to now, and the attempt's span from now, left open.
//
// With the submitter's span as their parent, the attempt's span is made
// first: when the sampler does not record it, the intake and queue spans
// are not made, since every standard sampler (OTEL_TRACES_SAMPLER) decides
// alike for spans of one trace under one parent. A job that is not
// sampled then costs one span id, which its target receives as its
// parent.
func startSpans(tracer *tracing.Tracer, job queue.Job, attempt int, enqueued, stored, now time.Time) traced {
	parent := job.Trace.SpanContext()
	if !parent.IsValid() {
		return startRoot(tracer, job, attempt, enqueued, stored, now)
	}
	d := tracer.Start(parent, "throttler.dispatch", tracing.KindClient, now)
	out := traced{out: job.Trace.Under(d.Context), tracer: tracer, span: d}
	if !d.Sampled() {
		return out
	}
	intakeAttrs, jobAttrs := spanAttrs(job, attempt)
	out.span.Attrs = jobAttrs
	if !enqueued.IsZero() {
		s := tracer.Start(parent, "throttler.intake", tracing.KindConsumer, enqueued)
		s.Attrs = intakeAttrs
		tracer.End(&s, enqueued)
	}
	q := tracer.Start(parent, "throttler.queue", tracing.KindInternal, stored)
	q.Attrs, q.Link = jobAttrs, parent
	tracer.End(&q, now)
	return out
}

// spanAttrs are the attributes of a delivery's spans, in one array: the
// intake's are its first four, the queue's the next four, and the
// attempt's those and its outcome and status, set when it ends (room for
// the last two follows them). Spans keep their attributes until export, so
// the array is never written after a span that shares it has ended: the
// attempt's outcome goes past the queue span's end.
func spanAttrs(job queue.Job, attempt int) (intake, spans []tracing.Attr) {
	key := job.Key
	if len(key) > queue.MaxKey {
		key = key[:queue.MaxKey]
	}
	attrs := make([]tracing.Attr, 5, 7)
	attrs[0], attrs[1], attrs[2], attrs[3], attrs[4] = intakeNATS, tracing.String(AttrLane, job.Lane), tracing.String(AttrKey, key),
		tracing.String(AttrJobID, job.ID), tracing.Int(AttrAttempt, attempt)
	return attrs[:4], attrs[1:5:7]
}

// startRoot makes the spans of a delivery of a job without a trace
// context (published on NATS without a traceparent, or stored while
// tracing was off) in one trace of their own: its first span, the intake
// (or else the queue span), is the root, and the later ones its children.
func startRoot(tracer *tracing.Tracer, job queue.Job, attempt int, enqueued, stored, now time.Time) traced {
	intakeAttrs, jobAttrs := spanAttrs(job, attempt)
	var root tracing.Span
	if !enqueued.IsZero() {
		root = tracer.Start(tracectx.SpanContext{}, "throttler.intake", tracing.KindConsumer, enqueued)
		root.Attrs = intakeAttrs
		tracer.End(&root, enqueued)
		q := tracer.Start(root.Context, "throttler.queue", tracing.KindInternal, stored)
		q.Attrs = jobAttrs
		tracer.End(&q, now)
	} else {
		root = tracer.Start(tracectx.SpanContext{}, "throttler.queue", tracing.KindInternal, stored)
		root.Attrs = jobAttrs
		tracer.End(&root, now)
	}
	d := tracer.Start(root.Context, "throttler.dispatch", tracing.KindClient, now)
	d.Attrs = jobAttrs
	return traced{out: job.Trace.Under(d.Context), tracer: tracer, span: d}
}

// end closes the attempt's span with the delivery's outcome.
func (t *traced) end(res dispatch.Result, at time.Time) {
	if t.tracer == nil || !t.span.Sampled() {
		return
	}
	attrs := append(t.span.Attrs, tracing.String(AttrOutcome, res.Verdict.String()))
	if res.Status != 0 {
		attrs = append(attrs, tracing.Int(AttrStatus, res.Status))
	}
	t.span.Attrs = attrs
	if res.Verdict != dispatch.Done {
		t.span.Error, t.span.ErrorMsg = true, res.Verdict.String()
		if res.Err != nil {
			t.span.ErrorMsg = res.Err.Error()
		}
	}
	t.tracer.End(&t.span, at)
}
