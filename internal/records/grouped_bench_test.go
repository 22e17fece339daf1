package records_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/testenv"
)

// greq is one job's entry for a grouper.
type greq struct {
	id   string
	bk   uint64
	b    []byte
	done chan uint64
}

// grouper is a group-commit loop: it takes every entry queued, writes one
// message per range, checks (claims only), and answers each entry.
type grouper struct {
	nc           *nats.Conn
	prefix       string
	kind         string
	check        bool
	ch           chan *greq
	sub          *nats.Subscription
	inbox        string
	n            int
	rounds, jobs int
}

func (g *grouper) run(b *testing.B) {
	var batch []*greq
	for r := range g.ch {
		batch = append(batch[:0], r)
	more:
		for len(batch) < 256 {
			select {
			case r2, ok := <-g.ch:
				if !ok {
					break more
				}
				batch = append(batch, r2)
			default:
				break more
			}
		}
		g.rounds++
		g.jobs += len(batch)
		seqs := map[uint64]uint64{}
		var bks []uint64
		groups := map[uint64][]byte{}
		for _, r := range batch {
			buf, ok := groups[r.bk]
			if !ok {
				bks = append(bks, r.bk)
				buf = append(buf, '[')
			} else {
				buf = append(buf, ',')
			}
			groups[r.bk] = append(buf, r.b...)
		}
		var maxSeq uint64
		for _, bk := range bks {
			body := append(groups[bk], ']')
			m := &nats.Msg{Subject: g.prefix + g.kind + "." + strconv.FormatUint(bk, 10) + "." + nuid.Next(), Data: body}
			resp, err := g.nc.RequestMsg(m, 5*time.Second)
			if err != nil {
				b.Error(err)
				return
			}
			var ack struct{ Seq uint64 }
			if err := json.Unmarshal(resp.Data, &ack); err != nil || ack.Seq == 0 {
				b.Errorf("ack %q %v", resp.Data, err)
				return
			}
			seqs[bk] = ack.Seq
			maxSeq = max(maxSeq, ack.Seq)
		}
		if g.check {
			subjects := make([]string, len(batch))
			for i, r := range batch {
				subjects[i] = g.prefix + base64.RawURLEncoding.EncodeToString([]byte(r.id))
			}
			q, _ := json.Marshal(map[string]any{"multi_last": subjects, "up_to_seq": maxSeq})
			g.n++
			reply := g.inbox + "." + strconv.Itoa(g.n)
			if err := g.nc.PublishRequest("$JS.API.DIRECT.GET.KV_THROTTLE_RECORDS_demo", reply, q); err != nil {
				b.Error(err)
				return
			}
			for {
				m, err := g.sub.NextMsg(5 * time.Second)
				if err != nil {
					b.Error(err)
					return
				}
				if m.Subject != reply {
					continue
				}
				st := m.Header.Get("Status")
				if st == "404" || st == "204" {
					break
				}
			}
		}
		for _, r := range batch {
			r.done <- seqs[r.bk]
		}
	}
}

// BenchmarkGroupedWritesSketch measures a design that is not built
// (docs/DESIGN.md, "Writing records in groups"): the drain's claims and
// ends written in groups, one stored message per range of 64 lane
// sequences per round of a group-commit loop, the claims of a round
// checked for cancel markers with one multi_last direct get up to the
// claims' sequence. Jobs are made as BenchmarkDrainWrites makes them, so
// the two compare side by side; nothing here reads the groups back.
func BenchmarkGroupedWritesSketch(b *testing.B) {
	nc, _ := testenv.JetStream(b, natsURL(b))
	s, err := records.New(nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.EnsureLane(context.Background(), records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20}); err != nil {
		b.Fatal(err)
	}
	prefix := "$KV." + records.BucketName("demo") + "."
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox + ".*")
	if err != nil {
		b.Fatal(err)
	}
	claims := &grouper{nc: nc, prefix: prefix, kind: "~c", check: true, ch: make(chan *greq, 1024), sub: sub, inbox: inbox}
	ends := &grouper{nc: nc, prefix: prefix, kind: "~e", ch: make(chan *greq, 1024)}
	go claims.run(b)
	go ends.run(b)
	defer close(claims.ch)
	defer close(ends.ch)
	var n atomic.Uint64
	run := "g" + strconv.FormatInt(time.Now().UnixNano(), 36) + "."
	b.SetParallelism(16)
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		done := make(chan uint64, 1)
		for pb.Next() {
			q := n.Add(1)
			id := run + strconv.FormatUint(q, 10)
			now := time.Now().UTC()
			rec := api.JobRecord{V: api.JobRecordVersion, ID: id, Lane: "demo", State: api.StateInFlight, StoredAt: &now, StartedAt: &now, Attempts: []api.JobAttempt{}}
			cb, _ := records.EncodeForBench(rec)
			claims.ch <- &greq{id: id, bk: q >> 6, b: cb, done: done}
			<-done
			rec.State, rec.FinishedAt = api.StateDelivered, &now
			rec.Attempts = append(rec.Attempts, api.JobAttempt{At: now, Status: 200, DurationMillis: 1.5})
			rec.Response = &api.JobResponse{Status: 200}
			eb, _ := records.EncodeForBench(rec)
			ends.ch <- &greq{id: id, bk: q >> 6, b: eb, done: done}
			<-done
		}
	})
	if cpu := cpuTime(); cpu0 > 0 && cpu > cpu0 {
		b.ReportMetric(float64(cpu-cpu0)/float64(b.N)/1e3, "cpu-µs/job")
	}
	b.ReportMetric(float64(claims.jobs)/float64(max(claims.rounds, 1)), "claims/round")
	b.ReportMetric(float64(ends.jobs)/float64(max(ends.rounds, 1)), "ends/round")
}
