package lane

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracectx"
)

// BenchmarkTraceSpans: the tracing cost of one job published on
// NATS, all of it: its intake, queue and attempt spans made and ended, and
// their share of the batcher and of the OTLP/HTTP export (protobuf
// encoding, one request per batch) to a receiver that reads and drops the
// bodies. The provider is the one cmd/throttler builds (batcher, parent
// based sampler), so ns/op is what tracing adds to a drained job; a job
// whose traceparent says "not sampled" records nothing but still gets a
// span id for its target.
func BenchmarkTraceSpans(b *testing.B) {
	var exported atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		exported.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(recv.URL+"/v1/traces"),
		otlptracehttp.WithCompression(otlptracehttp.NoCompression))
	if err != nil {
		b.Fatal(err)
	}
	// Blocking keeps every span: a full queue would drop spans and make
	// the figure look cheaper than the export it skipped.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking()),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	tracer := tp.Tracer(TracerName)
	job := queue.Job{ID: "01JDRAIN0000000000000000001", Lane: "bench", Key: "customer-0001"}
	stored := time.Now()
	ctx := context.Background()
	// The traceparents are made beforehand, as the drain reads them with
	// the job.
	parents := make([][2]string, 1<<12)
	for i := range parents {
		for flags := range 2 {
			parents[i][flags] = tracectx.Format(tracectx.TraceID{byte(i >> 8), byte(i), 1}, tracectx.SpanID{byte(i), 1}, byte(flags))
		}
	}
	for _, step := range []struct {
		name  string
		flags int
	}{{"sampled", 1}, {"not sampled", 0}} {
		b.Run(step.name, func(b *testing.B) {
			b.ReportAllocs()
			if err := tp.ForceFlush(context.Background()); err != nil {
				b.Fatal(err)
			}
			before := exported.Load()
			i := 0
			for b.Loop() {
				i++
				job.Trace = tracectx.Context{Parent: parents[i%len(parents)][step.flags]}
				now := stored.Add(time.Millisecond)
				tr := startSpans(ctx, tracer, job, 1, stored, stored, now)
				tr.end(dispatch.Result{Verdict: dispatch.Done, Status: http.StatusOK}, now.Add(time.Millisecond))
			}
			if err := tp.ForceFlush(context.Background()); err != nil {
				b.Fatal(err)
			}
			// What a job adds to the exports: with the batcher blocking
			// none is dropped, so a drain can tell from its own exports
			// whether its batcher dropped spans.
			b.ReportMetric(float64(exported.Load()-before)/float64(b.N), "exported-B/op")
		})
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	if exported.Load() == 0 {
		b.Fatal("no span reached the receiver")
	}
}
