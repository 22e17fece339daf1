package records_test

import (
	"bytes"
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/testenv"
)

// BenchmarkStoredMessage: the process's CPU (client and in-process
// server) per message stored in a key-value bucket like the records', by
// how the messages are sent. It is the floor under the drain's writes:
// each claim and each end is one such message (docs/BENCHMARKS.md, "Job
// records").
//
//   - request: one request per message, 32 at once (the drain's writes
//     today); memory: the same on memory storage;
//   - pipelined: one goroutine publishes 32 messages, then reads their 32
//     answers;
//   - atomic batch: 32 messages in one atomic batch (Nats-Batch-Id), each
//     with its compare-and-set, one answer;
//   - list: one message naming 32 ids (per id).
func BenchmarkStoredMessage(b *testing.B) {
	const w = 32
	body := []byte(`{"v":1,"id":"d-123456","lane":"demo","state":"in_flight","stored_at":"2026-12-06T08:00:00.123456789Z","started_at":"2026-12-06T08:00:00.123456789Z","attempts":[]}`)
	request := func(b *testing.B, nc *nats.Conn, subject func() string) int {
		b.SetParallelism(w / 2) // × GOMAXPROCS
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := nc.RequestMsg(casMsg(subject(), body), 5*time.Second); err != nil {
					b.Error(err)
					return
				}
			}
		})
		return b.N
	}
	for _, bc := range []struct {
		name    string
		storage jetstream.StorageType
		run     func(b *testing.B, nc *nats.Conn, subject func() string) int
	}{
		{"request", jetstream.FileStorage, request},
		{"request, memory", jetstream.MemoryStorage, request},
		{"pipelined", jetstream.FileStorage, func(b *testing.B, nc *nats.Conn, subject func() string) int {
			inbox := nc.NewInbox()
			answers := make(chan *nats.Msg, w)
			sub, err := nc.ChanSubscribe(inbox+".*", answers)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			for i := 0; i < b.N; i += w {
				for j := range w {
					m := casMsg(subject(), body)
					m.Reply = inbox + "." + strconv.Itoa(j)
					if err := nc.PublishMsg(m); err != nil {
						b.Fatal(err)
					}
				}
				for range w {
					if a := <-answers; bytes.Contains(a.Data, []byte(`"error"`)) {
						b.Fatal(string(a.Data))
					}
				}
			}
			return (b.N + w - 1) / w * w
		}},
		{"atomic batch", jetstream.FileStorage, func(b *testing.B, nc *nats.Conn, subject func() string) int {
			for i := 0; i < b.N; i += w {
				id := "b" + strconv.Itoa(i)
				for j := 1; j <= w; j++ {
					m := casMsg(subject(), body)
					m.Header.Set("Nats-Batch-Id", id)
					m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(j))
					if j < w {
						if err := nc.PublishMsg(m); err != nil {
							b.Fatal(err)
						}
						continue
					}
					m.Header.Set("Nats-Batch-Commit", "1")
					a, err := nc.RequestMsg(m, 5*time.Second)
					if err != nil {
						b.Fatal(err)
					}
					if bytes.Contains(a.Data, []byte(`"error"`)) {
						b.Fatal(string(a.Data))
					}
				}
			}
			return (b.N + w - 1) / w * w
		}},
		{"list", jetstream.FileStorage, func(b *testing.B, nc *nats.Conn, subject func() string) int {
			list := bytes.Repeat([]byte(`"d-123456789",`), w)
			for i := 0; i < b.N; i += w {
				if _, err := nc.RequestMsg(casMsg(subject(), list), 5*time.Second); err != nil {
					b.Fatal(err)
				}
			}
			return (b.N + w - 1) / w * w
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := testenv.StartNATS(b)
			nc, js := testenv.JetStream(b, srv.ClientURL())
			ctx := context.Background()
			if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "SHAPES", History: 1, TTL: time.Hour, Storage: bc.storage}); err != nil {
				b.Fatal(err)
			}
			st, err := js.Stream(ctx, "KV_SHAPES")
			if err != nil {
				b.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			cfg.AllowAtomicPublish = true
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			subject := func() string { return "$KV.SHAPES.k" + strconv.FormatInt(n.Add(1), 10) }
			cpu0 := cpuTime()
			msgs := bc.run(b, nc, subject)
			if cpu := cpuTime(); cpu0 > 0 && cpu > cpu0 && msgs > 0 {
				b.ReportMetric(float64(cpu-cpu0)/float64(msgs)/1e3, "cpu-µs/msg")
			}
		})
	}
}

// casMsg is a create-if-absent of subject, as the drain's claim of a job
// without a record.
func casMsg(subject string, body []byte) *nats.Msg {
	return &nats.Msg{Subject: subject, Data: body, Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: {"0"}}}
}

// BenchmarkClientWrites: this process's CPU per record-sized write by how
// it is sent: a request each, 32 at once (as the drain's writes go), or
// pipelined from one goroutine (32 published back to back, then their
// answers read). With THROTTLER_BENCH_NATS_URL naming a nats-server of its
// own process the figure is the client's alone (docs/DESIGN.md, "The
// drain's two writes").
func BenchmarkClientWrites(b *testing.B) {
	body := []byte(`{"v":1,"id":"d-123456","lane":"demo","state":"in_flight","stored_at":"2026-12-06T08:00:00.123456789Z","started_at":"2026-12-06T08:00:00.123456789Z","attempts":[]}`)
	nc, js := testenv.JetStream(b, natsURL(b))
	ctx := context.Background()
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CLIENTW", History: 1, TTL: time.Hour}); err != nil {
		b.Fatal(err)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var n atomic.Int64
	b.Run("request", func(b *testing.B) {
		b.SetParallelism(16)
		cpu0 := cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m := &nats.Msg{Subject: "$KV.CLIENTW.k" + run + strconv.FormatInt(n.Add(1), 10), Data: body, Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: {"0"}}}
				if _, err := nc.RequestMsg(m, 5*time.Second); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e3, "cpu-µs/msg")
	})
	b.Run("pipelined", func(b *testing.B) {
		const w = 32
		inbox := nc.NewInbox()
		answers := make(chan *nats.Msg, w)
		sub, err := nc.ChanSubscribe(inbox+".*", answers)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		cpu0 := cpuTime()
		for i := 0; i < b.N; i += w {
			for j := range w {
				m := &nats.Msg{Subject: "$KV.CLIENTW.k" + run + strconv.FormatInt(n.Add(1), 10), Data: body, Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: {"0"}}}
				m.Reply = inbox + "." + strconv.Itoa(j)
				if err := nc.PublishMsg(m); err != nil {
					b.Fatal(err)
				}
			}
			for range w {
				<-answers
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu0)/float64((b.N+w-1)/w*w)/1e3, "cpu-µs/msg")
	})
}
