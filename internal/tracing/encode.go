package tracing

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// The OTLP protobuf messages written here, by field number
// (opentelemetry/proto/collector/trace/v1/trace_service.proto and
// trace/v1/trace.proto): ExportTraceServiceRequest{1: ResourceSpans},
// ResourceSpans{1: Resource, 2: ScopeSpans}, Resource{1: KeyValue},
// ScopeSpans{1: InstrumentationScope, 2: Span}, InstrumentationScope{1:
// name}, Span{1: trace_id, 2: span_id, 3: trace_state, 4: parent_span_id,
// 5: name, 6: kind, 7: start_time_unix_nano, 8: end_time_unix_nano, 9:
// attributes, 13: links, 15: status, 16: flags}, Link{1: trace_id, 2:
// span_id, 3: trace_state, 6: flags}, Status{2: message, 3: code},
// KeyValue{1: key, 2: AnyValue}, AnyValue{1: string_value, 3: int_value}.

const (
	statusCodeError = 2
	// Span and link flags: bits 0-7 are the W3C trace flags; bit 8 says
	// bit 9 is known, bit 9 that the parent (or linked) span is remote.
	flagHasIsRemote = 0x100
	flagIsRemote    = 0x200
)

func appendBytesField(b []byte, n protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendStringField(b []byte, n protowire.Number, v string) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, v)
}

// appendAttr writes a as a KeyValue in field n.
func appendAttr(b []byte, n protowire.Number, a Attr) []byte {
	var vlen int
	if a.IsInt {
		vlen = 1 + protowire.SizeVarint(uint64(a.Int))
	} else {
		vlen = 1 + protowire.SizeBytes(len(a.Str))
	}
	kvlen := 1 + protowire.SizeBytes(len(a.Key)) + 1 + protowire.SizeBytes(vlen)
	b = protowire.AppendTag(b, n, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(kvlen))
	b = appendStringField(b, 1, a.Key)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(vlen))
	if a.IsInt {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(a.Int))
	}
	return appendStringField(b, 1, a.Str)
}

// appendSpan writes s's Span message (without its tag and length).
func appendSpan(b []byte, s *Span) []byte {
	b = appendBytesField(b, 1, s.Context.TraceID[:])
	b = appendBytesField(b, 2, s.Context.SpanID[:])
	if s.Context.State != "" {
		b = appendStringField(b, 3, s.Context.State)
	}
	if s.Parent != ([8]byte{}) {
		b = appendBytesField(b, 4, s.Parent[:])
	}
	b = appendStringField(b, 5, s.Name)
	b = protowire.AppendTag(b, 6, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(s.Kind))
	b = protowire.AppendTag(b, 7, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, uint64(s.Start.UnixNano()))
	b = protowire.AppendTag(b, 8, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, uint64(s.End.UnixNano()))
	for _, a := range s.Attrs {
		b = appendAttr(b, 9, a)
	}
	if l := s.Link; l.IsValid() {
		size := 2*2 + len(l.TraceID) + len(l.SpanID) + 1 + 4
		if l.State != "" {
			size += 1 + protowire.SizeBytes(len(l.State))
		}
		b = protowire.AppendTag(b, 13, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		b = appendBytesField(b, 1, l.TraceID[:])
		b = appendBytesField(b, 2, l.SpanID[:])
		if l.State != "" {
			b = appendStringField(b, 3, l.State)
		}
		b = protowire.AppendTag(b, 6, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, remoteFlags(l.Flags, l.Remote))
	}
	if s.Error {
		size := 2
		if s.ErrorMsg != "" {
			size += 1 + protowire.SizeBytes(len(s.ErrorMsg))
		}
		b = protowire.AppendTag(b, 15, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		if s.ErrorMsg != "" {
			b = appendStringField(b, 2, s.ErrorMsg)
		}
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, statusCodeError)
	}
	b = protowire.AppendTag(b, 16, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, remoteFlags(s.Context.Flags, s.ParentRemote))
}

func remoteFlags(flags byte, remote bool) uint32 {
	f := uint32(flags) | flagHasIsRemote
	if remote {
		f |= flagIsRemote
	}
	return f
}

// encodeResource writes ResourceSpans' field 1, the Resource with attrs
// in key order.
func encodeResource(attrs []Attr) []byte {
	attrs = slices.Clone(attrs)
	slices.SortStableFunc(attrs, func(a, b Attr) int { return strings.Compare(a.Key, b.Key) })
	var msg []byte
	for _, a := range attrs {
		msg = appendAttr(msg, 1, a)
	}
	return appendBytesField(nil, 1, msg)
}

// encodeScope writes ScopeSpans' field 1, the InstrumentationScope.
func encodeScope(name string) []byte {
	return appendBytesField(nil, 1, appendStringField(nil, 1, name))
}

// encode writes the ExportTraceServiceRequest of spans into t.buf and
// returns it: the spans first, after room for the request's head, whose
// lengths are then known, written right before them.
func (t *Tracer) encode(spans []Span) []byte {
	room := 2*(1+protowire.SizeVarint(1<<62)) + len(t.resource) + len(t.scope)
	buf := append(t.buf[:0], make([]byte, room)...)
	for i := range spans {
		t.scratch = appendSpan(t.scratch[:0], &spans[i])
		buf = appendBytesField(buf, 2, t.scratch)
	}
	t.buf = buf
	ssLen := len(t.scope) + len(buf) - room
	rsLen := len(t.resource) + 1 + protowire.SizeVarint(uint64(ssLen)) + ssLen
	head := protowire.AppendTag(t.head[:0], 1, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(rsLen))
	head = append(head, t.resource...)
	head = protowire.AppendTag(head, 2, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(ssLen))
	head = append(head, t.scope...)
	t.head = head
	start := room - len(head)
	copy(buf[start:room], head)
	return buf[start:]
}
