package lane

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// BenchmarkTraceSpans: the tracing cost of one job published on NATS, all
// of it: its intake, queue and attempt spans made and ended, and their
// share of the OTLP/HTTP export (protobuf encoding, one request per batch
// of 512 spans) to a receiver that reads and drops the bodies. The tracer
// is the one cmd/throttler builds (parent-based sampler); the loop itself
// exports a batch as soon as it is full, so no span is dropped and ns/op
// is what tracing adds to a drained job. A job whose traceparent says
// "not sampled" records nothing but still gets a span id for its target.
func BenchmarkTraceSpans(b *testing.B) {
	var exported atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		exported.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()
	tracer, err := tracing.New(tracing.Config{Endpoint: recv.URL + "/v1/traces", Sampler: tracing.DefaultSampler})
	if err != nil {
		b.Fatal(err)
	}
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
	const jobsPerBatch = tracing.DefaultBatchSize / 3
	for _, step := range []struct {
		name  string
		flags int
	}{{"sampled", 1}, {"not sampled", 0}} {
		b.Run(step.name, func(b *testing.B) {
			b.ReportAllocs()
			before := exported.Load()
			i := 0
			for b.Loop() {
				i++
				job.Trace = tracectx.Context{Parent: parents[i%len(parents)][step.flags]}
				now := stored.Add(time.Millisecond)
				tr := startSpans(tracer, job, 1, stored, stored, now)
				tr.end(dispatch.Result{Verdict: dispatch.Done, Status: http.StatusOK}, now.Add(time.Millisecond))
				if i%jobsPerBatch == 0 {
					if err := tracer.Flush(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := tracer.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			// What a job adds to the exports.
			b.ReportMetric(float64(exported.Load()-before)/float64(b.N), "exported-B/op")
		})
	}
	if exported.Load() == 0 {
		b.Fatal("no span reached the receiver")
	}
}
