package tracectx

import (
	"go.opentelemetry.io/otel/trace"
)

// SpanContext is c's traceparent (and tracestate) as OpenTelemetry's remote
// span context: the parent of the spans the throttler makes for the job.
// It is invalid (IsValid false) when c has no Parent.
func (c Context) SpanContext() trace.SpanContext {
	if c.Parent == "" {
		return trace.SpanContext{}
	}
	tid, sid, flags, err := ParseParent(c.Parent)
	if err != nil {
		return trace.SpanContext{}
	}
	cfg := trace.SpanContextConfig{TraceID: trace.TraceID(tid), SpanID: trace.SpanID(sid), TraceFlags: trace.TraceFlags(flags), Remote: true}
	if c.State != "" {
		if ts, err := trace.ParseTraceState(c.State); err == nil {
			cfg.TraceState = ts
		}
	}
	return trace.NewSpanContext(cfg)
}

// Under returns c as the child of sc, the throttler's own span: its
// traceparent names sc (trace id, span id, flags), its tracestate and
// baggage stay c's. An invalid sc (no span) returns c unchanged.
func (c Context) Under(sc trace.SpanContext) Context {
	if !sc.IsValid() {
		return c
	}
	c.Parent = Format(TraceID(sc.TraceID()), SpanID(sc.SpanID()), byte(sc.TraceFlags()))
	return c
}
