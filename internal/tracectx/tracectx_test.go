package tracectx_test

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/tracectx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		parent, state, baggage string
		wantHeader             string // "" = valid
		wantParent             string
	}{
		{name: "empty"},
		{name: "version 00", parent: parent, wantParent: parent},
		{name: "later version with extra fields", parent: "01" + parent[2:] + "-what-ever", wantParent: parent},
		{name: "later version, exactly 55", parent: "cc" + parent[2:], wantParent: parent},
		{name: "version ff", parent: "ff" + parent[2:], wantHeader: "traceparent"},
		{name: "version 00 too long", parent: parent + "-x", wantHeader: "traceparent"},
		{name: "upper case", parent: strings.ToUpper(parent), wantHeader: "traceparent"},
		{name: "short", parent: parent[:54], wantHeader: "traceparent"},
		{name: "zero trace id", parent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01", wantHeader: "traceparent"},
		{name: "zero span id", parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", wantHeader: "traceparent"},
		{name: "bad separator", parent: "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", wantHeader: "traceparent"},
		{name: "later version, no dash after", parent: "01" + parent[2:] + "x", wantHeader: "traceparent"},
		{name: "state", parent: parent, state: "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,tenant@sys=v", wantParent: parent},
		{name: "state without parent", state: "rojo=1", wantHeader: "tracestate"},
		{name: "state bad key", parent: parent, state: "Rojo=1", wantHeader: "tracestate"},
		{name: "state bad value", parent: parent, state: "rojo=a=b", wantHeader: "tracestate"},
		{name: "state duplicate key", parent: parent, state: "rojo=1,rojo=2", wantHeader: "tracestate"},
		{name: "state too long", parent: parent, state: "k=" + strings.Repeat("v", 511), wantHeader: "tracestate"},
		{name: "state with CRLF", parent: parent, state: "k=v\r\nx: y", wantHeader: "tracestate"},
		{name: "baggage alone", baggage: "userId=alice,serverNode=DF%2028;prop,isProduction=false", wantParent: ""},
		{name: "baggage space in value", baggage: "k=a b", wantHeader: "baggage"},
		{name: "baggage no =", baggage: "k", wantHeader: "baggage"},
		{name: "baggage control", baggage: "k=\x01", wantHeader: "baggage"},
		{name: "baggage too long", baggage: "k=" + strings.Repeat("v", tracectx.MaxBaggage), wantHeader: "baggage"},
		{name: "baggage too many", baggage: strings.Repeat("k=v,", 64) + "k=v", wantHeader: "baggage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tracectx.Parse(tc.parent, tc.state, tc.baggage)
			if tc.wantHeader != "" {
				var e *tracectx.Error
				if !errors.As(err, &e) || e.Header != tc.wantHeader || !errors.Is(err, tracectx.ErrInvalid) {
					t.Fatalf("err = %v, want an error naming %s", err, tc.wantHeader)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Parent != tc.wantParent || c.State != tc.state || c.Baggage != tc.baggage {
				t.Fatalf("got %+v", c)
			}
		})
	}
}

// TestUnder: the context a target receives names the throttler's span as
// its parent, in the submitter's trace, with the submitter's tracestate
// and baggage; without a span it is the submitter's own.
func TestUnder(t *testing.T) {
	c, err := tracectx.Parse(parent, "rojo=1", "k=v")
	if err != nil {
		t.Fatal(err)
	}
	psc := c.SpanContext()
	if !psc.IsValid() || !psc.Remote || !psc.Sampled() || psc.State != "rojo=1" {
		t.Fatalf("parent span context %+v", psc)
	}
	sid := tracectx.SpanID{1, 2, 3, 4, 5, 6, 7, 8}
	sc := tracectx.SpanContext{TraceID: psc.TraceID, SpanID: sid, Flags: psc.Flags}
	ch := c.Under(sc)
	tid, got, flags, err := tracectx.ParseParent(ch.Parent)
	if err != nil {
		t.Fatal(err)
	}
	if tid != psc.TraceID || got != sid || flags != 1 || ch.State != "rojo=1" || ch.Baggage != "k=v" {
		t.Fatalf("child %+v of %+v", ch, c)
	}
	if same := c.Under(tracectx.SpanContext{}); same != c {
		t.Fatalf("without a span: %+v, want %+v", same, c)
	}
	if (tracectx.Context{Baggage: "k=v"}).SpanContext().IsValid() {
		t.Fatal("a context without a traceparent made a valid span context")
	}
}
