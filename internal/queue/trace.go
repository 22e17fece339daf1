package queue

import (
	"net/textproto"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/tracectx"
)

// Trace context on stored jobs.
//
// A job keeps its submitter's W3C trace context in three headers of its
// stored message: traceparent, tracestate and baggage (canonical keys, as
// jobMsg writes every header). A message published on a public subject
// keeps the publisher's own headers of those names, which may be spelled
// in any case (NATS headers are case-sensitive, the W3C names lower case);
// they are checked like an HTTP submission's, and dropped, with the reason
// in Job.TraceErr, when they are not well formed or over their bounds. A
// dead letter keeps them too, so a replay continues the same trace.

// Canonical keys of the trace headers on stored messages.
var (
	headerTraceparent = textproto.CanonicalMIMEHeaderKey(tracectx.HeaderTraceparent)
	headerTracestate  = textproto.CanonicalMIMEHeaderKey(tracectx.HeaderTracestate)
	headerBaggage     = textproto.CanonicalMIMEHeaderKey(tracectx.HeaderBaggage)
)

// decodeTrace reads the trace context of a stored message, its header
// names in any case, in one pass over the headers (a message without trace
// headers costs a length comparison a header); err says why headers that
// were there were dropped.
func decodeTrace(h nats.Header) (tracectx.Context, error) {
	var tp, ts, bg string
	for k, v := range h {
		if len(v) == 0 {
			continue
		}
		switch len(k) {
		case len(tracectx.HeaderTraceparent):
			if strings.EqualFold(k, tracectx.HeaderTraceparent) {
				tp = joinValues(tp, v)
			}
		case len(tracectx.HeaderTracestate):
			if strings.EqualFold(k, tracectx.HeaderTracestate) {
				ts = joinValues(ts, v)
			}
		case len(tracectx.HeaderBaggage):
			if strings.EqualFold(k, tracectx.HeaderBaggage) {
				bg = joinValues(bg, v)
			}
		}
	}
	if tp == "" && ts == "" && bg == "" {
		return tracectx.Context{}, nil
	}
	return tracectx.Parse(tp, ts, bg)
}

// joinValues joins a header's values (and those of another spelling of
// its name) with commas: two traceparents make an invalid one, as W3C
// wants, while list headers (tracestate, baggage) combine.
func joinValues(have string, v []string) string {
	all := strings.Join(v, ",")
	if have == "" {
		return all
	}
	return have + "," + all
}

// setTrace writes c on a message the throttler stores itself (dead
// letters).
func setTrace(h nats.Header, c tracectx.Context) {
	if c.Parent != "" {
		h[headerTraceparent] = []string{c.Parent}
	}
	if c.State != "" {
		h[headerTracestate] = []string{c.State}
	}
	if c.Baggage != "" {
		h[headerBaggage] = []string{c.Baggage}
	}
}
