package tracectx

// SpanContext is one span's identity as W3C trace context writes it: the
// trace it belongs to, its own id, the trace flags (bit 0: sampled) and
// the tracestate that travels with it. The zero value is no span
// (IsValid false).
type SpanContext struct {
	TraceID TraceID
	SpanID  SpanID
	Flags   byte
	State   string
	// Remote says the span is another process's (a submitter's or a
	// publisher's), not one the throttler made.
	Remote bool
}

// FlagSampled is the trace flag saying the span is recorded.
const FlagSampled byte = 0x01

// IsValid reports whether sc names a span: a non-zero trace and span id.
func (sc SpanContext) IsValid() bool { return sc.TraceID != (TraceID{}) && sc.SpanID != (SpanID{}) }

// Sampled reports whether sc's sampled flag is set.
func (sc SpanContext) Sampled() bool { return sc.Flags&FlagSampled != 0 }

// SpanContext is c's traceparent (and tracestate) as the remote span
// context that is the parent of the spans the throttler makes for the job.
// It is invalid (IsValid false) when c has no Parent.
func (c Context) SpanContext() SpanContext {
	if c.Parent == "" {
		return SpanContext{}
	}
	tid, sid, flags, err := ParseParent(c.Parent)
	if err != nil {
		return SpanContext{}
	}
	return SpanContext{TraceID: tid, SpanID: sid, Flags: flags, State: c.State, Remote: true}
}

// Under returns c as the child of sc, the throttler's own span: its
// traceparent names sc (trace id, span id, flags), its tracestate and
// baggage stay c's. An invalid sc (no span) returns c unchanged.
func (c Context) Under(sc SpanContext) Context {
	if !sc.IsValid() {
		return c
	}
	c.Parent = Format(sc.TraceID, sc.SpanID, sc.Flags)
	return c
}
