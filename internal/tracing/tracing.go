// Package tracing makes the throttler's spans and exports them over
// OTLP/HTTP (binary protobuf, https://opentelemetry.io/docs/specs/otlp/).
//
// It is the part of OpenTelemetry the throttler uses, written for the
// drain's hot path: a Span is a plain value (ids, times, attributes, one
// link) that the caller fills and hands to Tracer.End; a sampled span is
// copied into a bounded queue, and Run encodes the queue in batches straight
// from those values into a reused buffer and posts them to the collector.
// A span that finds the queue full is dropped and counted
// (throttler_trace_spans_dropped_total), never waited for: tracing never
// slows a delivery.
//
// Ids are W3C trace context's (tracectx.SpanContext). The Sampler is the
// standard OTEL_TRACES_SAMPLER set: a trace-id ratio for roots, optionally
// following the parent's sampled flag.
//
// A Tracer is safe for concurrent use; a nil *Tracer is not usable (the
// callers keep a nil one for "tracing off" and make no span).
package tracing

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/throttler/throttler/internal/tracectx"
)

// Kind is a span's kind, numbered as OTLP numbers them.
type Kind int32

// The span kinds.
const (
	KindInternal Kind = 1
	KindServer   Kind = 2
	KindClient   Kind = 3
	KindProducer Kind = 4
	KindConsumer Kind = 5
)

// Attr is one span attribute: a string, or an integer when IsInt.
type Attr struct {
	Key   string
	Str   string
	Int   int64
	IsInt bool
}

// String is a string attribute.
func String(key, value string) Attr { return Attr{Key: key, Str: value} }

// Int is an integer attribute.
func Int(key string, value int) Attr { return Attr{Key: key, Int: int64(value), IsInt: true} }

// Span is one span, filled by its maker between Tracer.Start and
// Tracer.End. The attributes are read when the span is exported, after
// End: the slice must not change after End (it may be shared by spans).
type Span struct {
	Name string
	Kind Kind
	// Context is the span's own identity; its Flags say whether it is
	// sampled (recorded and exported).
	Context tracectx.SpanContext
	// Parent is the parent span's id (zero for a root), ParentRemote
	// whether that span is another process's.
	Parent       tracectx.SpanID
	ParentRemote bool
	Start, End   time.Time
	Attrs        []Attr
	// Link is the one span this span is linked to; zero for none.
	Link tracectx.SpanContext
	// Error marks the span failed; ErrorMsg says why.
	Error    bool
	ErrorMsg string
}

// Sampled reports whether s is recorded (exported when it ends).
func (s *Span) Sampled() bool { return s.Context.Sampled() }

// Sampler decides which spans are recorded: a span with a parent follows
// the parent's sampled flag when FollowParent is set; a root (or every
// span, without FollowParent) is sampled when its trace id falls in the
// share Ratio (0 to 1) of trace ids, the way OpenTelemetry's
// TraceIDRatioBased sampler reads the id, so spans of one trace are
// sampled alike whoever samples them. The zero value samples nothing
// (always_off); DefaultSampler is parentbased_always_on.
type Sampler struct {
	Ratio        float64
	FollowParent bool
}

// DefaultSampler follows the parent's decision and samples every root.
var DefaultSampler = Sampler{Ratio: 1, FollowParent: true}

func (s Sampler) sample(parent tracectx.SpanContext, tid tracectx.TraceID) bool {
	if s.FollowParent && parent.IsValid() {
		return parent.Sampled()
	}
	switch {
	case s.Ratio >= 1:
		return true
	case s.Ratio <= 0:
		return false
	}
	bound := uint64(s.Ratio * (1 << 63))
	return binary.BigEndian.Uint64(tid[8:16])>>1 < bound
}

// Start begins a span named name of kind kind at start: a child of parent
// in parent's trace (with its tracestate), or, for an invalid parent, the
// root of a new trace. The sampler decides its sampled flag. Fill its
// attributes and end it with End.
func (t *Tracer) Start(parent tracectx.SpanContext, name string, kind Kind, start time.Time) Span {
	s := Span{Name: name, Kind: kind, Start: start}
	if parent.IsValid() {
		s.Context.TraceID, s.Context.State = parent.TraceID, parent.State
		s.Parent, s.ParentRemote = parent.SpanID, parent.Remote
	} else {
		s.Context.TraceID = newTraceID()
	}
	s.Context.SpanID = newSpanID()
	if t.cfg.Sampler.sample(parent, s.Context.TraceID) {
		s.Context.Flags = parent.Flags | tracectx.FlagSampled
	} else {
		s.Context.Flags = parent.Flags &^ tracectx.FlagSampled
	}
	return s
}

func newTraceID() tracectx.TraceID {
	var id tracectx.TraceID
	for id == (tracectx.TraceID{}) {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func newSpanID() tracectx.SpanID {
	var id tracectx.SpanID
	for id == (tracectx.SpanID{}) {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

// ctxKey carries a span context in a context.Context.
type ctxKey struct{}

// ContextWith returns ctx carrying sc, the span work under ctx is part of.
func ContextWith(ctx context.Context, sc tracectx.SpanContext) context.Context {
	return context.WithValue(ctx, ctxKey{}, sc)
}

// FromContext is the span context ctx carries (ContextWith); invalid for
// none.
func FromContext(ctx context.Context) tracectx.SpanContext {
	sc, _ := ctx.Value(ctxKey{}).(tracectx.SpanContext)
	return sc
}
