package queue_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
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

// BenchmarkKeyedRead: one read of each of 2,000 keys' first job (two jobs
// stored a key, in rounds, as throttler-bench's keyed rows store them), the
// keys visited in a shuffled order as a sweep claims them, through a fresh
// reader each round: out of the read-ahead across keys ("ahead"), and one
// direct get a key as a server without batch gets makes it ("alone").
// Reports ns and NATS requests per key read.
//
//	go test -run '^$' -bench KeyedRead -benchtime 20x ./internal/queue/
func BenchmarkKeyedRead(b *testing.B) {
	const keys = 2000
	q, nc := newBareQueue(b)
	ctx := context.Background()
	s := intakeSpec(10 * keys)
	if err := q.EnsureKeyedLane(ctx, s); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	var futures []jetstream.PubAckFuture
	for i := range 2 * keys {
		f, err := js.PublishAsync(queue.InternalSubject("demo", "k"+strconv.Itoa(i%keys)), benchPayload)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(keys)
	for _, mode := range []string{"ahead", "alone"} {
		b.Run(mode, func(b *testing.B) {
			var reqs uint64
			for b.Loop() {
				r, err := q.KeyedReader("demo")
				if err != nil {
					b.Fatal(err)
				}
				if mode == "alone" {
					queue.SetScanBatch(r, 0)
				}
				before := nc.Stats().OutMsgs
				for _, i := range order {
					m, err := r.Next(ctx, "k"+strconv.Itoa(i), 0)
					if err != nil || m == nil {
						b.Fatalf("key %d: %v, %v", i, m, err)
					}
				}
				reqs += nc.Stats().OutMsgs - before
				r.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys), "ns/key")
			b.ReportMetric(float64(reqs)/float64(b.N*keys), "requests/key")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkListDead: one page of 1,000 dead letters (payloads of
// benchPayload), listed as the API does (direct: one batch direct get)
// beside one message get per dead letter (each: a stream without direct
// gets), on a server in the same process over loopback TCP.
//
//	go test -run '^$' -bench ListDead ./internal/queue
func BenchmarkListDead(b *testing.B) {
	url := testenv.StartNATS(b).ClientURL()
	q, nc := bareQueueOn(b, url)
	storeDead(b, nc, "demo", 1000, len(benchPayload))
	ctx := context.Background()
	list := map[string]func() ([]api.DeadLetter, error){
		"direct": func() ([]api.DeadLetter, error) { return q.ListDead(ctx, "demo", 0, 1000) },
		"each":   func() ([]api.DeadLetter, error) { return queue.ListDeadEach(ctx, q, "demo", 0, 1000) },
	}
	for _, name := range []string{"each", "direct"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dead, err := list[name]()
				if err != nil || len(dead) != 1000 {
					b.Fatalf("%d dead letters, %v", len(dead), err)
				}
			}
		})
	}
}
