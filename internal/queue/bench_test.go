package queue_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/throttler/throttler/internal/queue"
)

// benchPayload is the payload of the publish benchmarks, the one of
// throttler-bench's intake rows.
var benchPayload = []byte(`{"event":"bench.ingest","customer":"c-0001","amount":4200,"ok":1}`)

const benchBatch = 100

// BenchmarkPublishBatch: PublishBatch of 100 JSON jobs with ids, on a lane
// of a server in the same process over loopback TCP (the queue side of a
// batch intake request), beside BenchmarkPublishAsync, which publishes the
// same payloads with a Nats-Msg-Id each and waits for the acks, as a user
// would without the throttler. Both report ns/job and allocations per
// batch.
//
//	go test -run '^$' -bench 'Publish(Batch|Async)' -benchmem ./internal/queue/
func BenchmarkPublishBatch(b *testing.B) {
	s := spec()
	s.MaxBacklog = 100_000_000
	s.MaxBody = 1 << 20
	q, _ := newQueue(b, s)
	ctx := context.Background()
	prefix := nuid.Next()
	jobs := make([]queue.Job, benchBatch)
	seq := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range jobs {
			seq++
			jobs[i] = queue.Job{ID: prefix + strconv.Itoa(seq), Lane: "demo", ContentType: "application/json", Payload: benchPayload}
		}
		res, err := q.PublishBatch(ctx, "demo", jobs)
		if err != nil {
			b.Fatal(err)
		}
		for i := range res {
			if res[i].Err != nil || res[i].Duplicate {
				b.Fatalf("job %d: %+v", i, res[i])
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/job")
}

// BenchmarkPublishAsync: the reference of BenchmarkPublishBatch.
func BenchmarkPublishAsync(b *testing.B) {
	s := spec()
	s.MaxBacklog = 100_000_000
	s.MaxBody = 1 << 20
	_, nc := newQueue(b, s)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	prefix := nuid.Next()
	subject := queue.Subject("demo", "")
	seq := 0
	b.ReportAllocs()
	for b.Loop() {
		futures := make([]jetstream.PubAckFuture, 0, benchBatch)
		for range benchBatch {
			seq++
			f, err := js.PublishAsync(subject, benchPayload, jetstream.WithMsgID(prefix+strconv.Itoa(seq)))
			if err != nil {
				b.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					b.Fatal("duplicate")
				}
			case err := <-f.Err():
				b.Fatal(err)
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/job")
}
