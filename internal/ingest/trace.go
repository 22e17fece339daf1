package ingest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// Trace context at HTTP intake.
//
// A submission may carry W3C trace context: the traceparent, tracestate
// and baggage headers of a single job (and the defaults of a batch's
// items), or a batch item's "trace" object. It is checked (tracectx) and
// stored with the job; a malformed or oversized value is refused with a
// 400 problem naming the header (or the item's JSON pointer), and nothing
// is stored (rejection reason invalid_trace_context).
//
// With tracing on (Config.Traces), each submission gets an intake span
// ("POST /v1/lanes/{lane}/jobs", a server span, child of the submitter's
// span), and a job that came without a traceparent is stored with the
// intake span as its parent, so that its wait and attempts join that trace.

// headerTrace reads the trace headers of r: one traceparent at most, the
// lines of tracestate and baggage joined as lists. A problem names the
// header that is wrong.
func headerTrace(r *http.Request) (tracectx.Context, error) {
	tp := r.Header.Values(tracectx.HeaderTraceparent)
	if len(tp) > 1 {
		return tracectx.Context{}, refusal(ErrBadHeader, tracectx.HeaderTraceparent, "traceparent: %d headers; at most one is allowed", len(tp))
	}
	var parent string
	if len(tp) == 1 {
		parent = tp[0]
	}
	c, err := tracectx.Parse(parent, joinHeader(r.Header.Values(tracectx.HeaderTracestate)), joinHeader(r.Header.Values(tracectx.HeaderBaggage)))
	if err != nil {
		return tracectx.Context{}, &Refusal{Err: ErrBadHeader, Cause: err, Field: traceField(err), Detail: err.Error()}
	}
	return c, nil
}

func joinHeader(v []string) string {
	switch len(v) {
	case 0:
		return ""
	case 1:
		return v[0]
	}
	out := v[0]
	for _, s := range v[1:] {
		out += "," + s
	}
	return out
}

// traceField names the header a tracectx error is about.
func traceField(err error) string {
	var e *tracectx.Error
	if errors.As(err, &e) {
		return e.Header
	}
	return tracectx.HeaderTraceparent
}

// jobTrace is the trace context to store with the job of r: its headers',
// or, without a traceparent and with tracing on, the intake span's.
func jobTrace(r *http.Request) (tracectx.Context, error) {
	c, err := headerTrace(r)
	if err != nil {
		return c, err
	}
	if c.Parent == "" {
		c = c.Under(tracing.FromContext(r.Context()))
	}
	return c, nil
}

// itemTrace checks the trace object of batch item i into job; an item
// without one keeps what the batch request's headers gave it.
func itemTrace(t *api.Trace, i int, job *queue.Job) *Refusal {
	if t == nil {
		return nil
	}
	c, err := tracectx.Parse(t.Traceparent, t.Tracestate, t.Baggage)
	if err != nil {
		return &Refusal{Err: ErrBadBody, Cause: err, Field: "/" + strconv.Itoa(i) + "/trace/" + traceField(err),
			Detail: fmt.Sprintf("item %d: trace.%v", i, err)}
	}
	job.Trace = c
	return nil
}

// batchTrace gives the batch request's trace context to the items that
// came without one.
func batchTrace(r *http.Request, jobs []batchJob) error {
	c, err := jobTrace(r)
	if err != nil || c.IsZero() {
		return err
	}
	for i := range jobs {
		if jobs[i].job.Trace.IsZero() {
			jobs[i].job.Trace = c
		}
	}
	return nil
}

// traced wraps a submission route in its intake span when tracing is on;
// with tracing off it returns next itself.
func (h *Handler) traced(route string, next http.HandlerFunc) http.HandlerFunc {
	tracer := h.cfg.Traces
	if tracer == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		// A malformed traceparent is refused by the route; the span is
		// then a root of its own.
		var parent tracectx.SpanContext
		if c, err := tracectx.Parse(r.Header.Get(tracectx.HeaderTraceparent), "", ""); err == nil {
			parent = c.SpanContext()
		}
		span := tracer.Start(parent, route, tracing.KindServer, time.Now())
		sw := &statusWriter{ResponseWriter: w}
		next(sw, r.WithContext(tracing.ContextWith(r.Context(), span.Context)))
		if !span.Sampled() {
			return
		}
		status := sw.code
		if status == 0 {
			status = http.StatusOK
		}
		outcome := "accepted"
		if status != http.StatusAccepted && status != http.StatusOK {
			outcome = "refused"
		}
		attrs := []tracing.Attr{tracing.String("http.request.method", r.Method), tracing.String("http.route", route),
			tracing.String("throttler.lane", metricLane(h.cfg.Lanes, r.PathValue("lane")))}
		if k := r.Header.Get(HeaderThrottleKey); k != "" && queue.ValidKey(k) == nil {
			attrs = append(attrs, tracing.String("throttler.key", k))
		}
		span.Attrs = append(attrs, tracing.Int("http.response.status_code", status), tracing.String("throttler.outcome", outcome))
		if status >= 500 {
			span.Error, span.ErrorMsg = true, http.StatusText(status)
		}
		tracer.End(&span, time.Now())
	}
}
