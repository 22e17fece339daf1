package dispatch

import (
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/tracectx"
)

// Every delivery carries the job's trace context (Job.Trace) in the W3C
// headers traceparent, tracestate and baggage: on an HTTP request, a NATS
// request or JetStream publish, and a pull-mode hand-out. The caller makes
// Job.Trace the context the target continues: the submitter's traceparent
// with the throttler's delivery span as its parent when tracing is on,
// else the submitter's own. A job's trace headers replace static headers
// of the same names.

// setTraceHTTP writes t on an HTTP request's headers.
func setTraceHTTP(h http.Header, t tracectx.Context) {
	if t.Parent != "" {
		h.Set(tracectx.HeaderTraceparent, t.Parent)
	}
	if t.State != "" {
		h.Set(tracectx.HeaderTracestate, t.State)
	}
	if t.Baggage != "" {
		h.Set(tracectx.HeaderBaggage, t.Baggage)
	}
}

// setTraceNATS writes t on a NATS message's headers, in W3C's lower case
// (NATS header names are case-sensitive; OpenTelemetry's NATS
// propagation reads them so).
func setTraceNATS(h nats.Header, t tracectx.Context) {
	if t.Parent != "" {
		h[tracectx.HeaderTraceparent] = []string{t.Parent}
	}
	if t.State != "" {
		h[tracectx.HeaderTracestate] = []string{t.State}
	}
	if t.Baggage != "" {
		h[tracectx.HeaderBaggage] = []string{t.Baggage}
	}
}
