package queue

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/tracectx"
)

const testParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestDecodeTrace: a publisher's trace headers are read in any case from a
// public subject, kept through a stored copy (retry, move), and dropped
// with the reason when malformed; the job itself is kept.
func TestDecodeTrace(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name    string
		h       nats.Header
		want    tracectx.Context
		wantErr bool
	}{
		{name: "none", h: nats.Header{"Nats-Msg-Id": {"a"}}},
		{name: "lower case, as W3C spells them", h: nats.Header{"traceparent": {testParent}, "tracestate": {"rojo=1"}, "baggage": {"k=v"}},
			want: tracectx.Context{Parent: testParent, State: "rojo=1", Baggage: "k=v"}},
		{name: "canonical", h: nats.Header{"Traceparent": {testParent}}, want: tracectx.Context{Parent: testParent}},
		{name: "odd case", h: nats.Header{"TRACEPARENT": {testParent}, "BaGgAgE": {"a=1", "b=2"}},
			want: tracectx.Context{Parent: testParent, Baggage: "a=1,b=2"}},
		{name: "two traceparents", h: nats.Header{"traceparent": {testParent, testParent}}, wantErr: true},
		{name: "malformed", h: nats.Header{"traceparent": {"00-xyz"}, "baggage": {"k=v"}}, wantErr: true},
		{name: "tracestate too long", h: nats.Header{"traceparent": {testParent}, "tracestate": {"k=" + string(make([]byte, 600))}}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := decodeJob("demo", tc.h, []byte("x"), "", 7, false, now)
			if job.ID == "" || string(job.Payload) != "x" {
				t.Fatalf("the job itself was not kept: %+v", job)
			}
			if tc.wantErr {
				if !errors.Is(job.TraceErr, tracectx.ErrInvalid) || !job.Trace.IsZero() {
					t.Fatalf("trace %+v err %v, want dropped with an error", job.Trace, job.TraceErr)
				}
				return
			}
			if job.TraceErr != nil || job.Trace != tc.want {
				t.Fatalf("trace %+v err %v, want %+v", job.Trace, job.TraceErr, tc.want)
			}
			// A copy the throttler stores (retry, move, replay) keeps it.
			copied := decodeJob("demo", jobMsg(job).Header, nil, "", 8, true, now)
			if copied.Trace != tc.want {
				t.Fatalf("stored copy trace %+v, want %+v", copied.Trace, tc.want)
			}
		})
	}
}
