package queue

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// TestBatchGetChecksTheChain: the batch direct get reader that the keyed
// read-ahead and the dead-letter listing share takes a whole answer and
// refuses one that is not a chain from its first message to its EOB, or
// whose message its caller's parse refuses. A responder on a real server
// answers for a stream that does not exist (the direct get subject of a
// name no stream has), with the answers of each case.
func TestBatchGetChecksTheChain(t *testing.T) {
	t.Parallel()
	url := testenv.StartNATS(t).ClientURL()
	connect := func() *nats.Conn {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	nc, fake := connect(), connect()

	deadSubj := DeadSubject("demo")
	keyPrefix := InternalSubject("demo", "") + "."
	// msg is a batch answer's message seq on subj after last.
	msg := func(seq, last uint64, subj string) *nats.Msg {
		m := nats.NewMsg("")
		m.Header.Set(hdrStreamSubj, subj)
		m.Header.Set(hdrStreamSeq, strconv.FormatUint(seq, 10))
		m.Header.Set(hdrStreamTime, time.Now().UTC().Format(time.RFC3339Nano))
		m.Header.Set(hdrNumPending, "0")
		m.Header.Set(hdrLastSeq, strconv.FormatUint(last, 10))
		m.Data = []byte("x")
		return m
	}
	plain := func(seq, last uint64) *nats.Msg { return msg(seq, last, keyPrefix+"k") }
	status := func(code string, kv ...string) *nats.Msg {
		m := nats.NewMsg("")
		m.Header.Set(hdrStatus, code)
		for i := 0; i+1 < len(kv); i += 2 {
			m.Header.Set(kv[i], kv[i+1])
		}
		return m
	}
	eob := func(last, pending uint64) *nats.Msg {
		return status(statusEOB, hdrLastSeq, strconv.FormatUint(last, 10), hdrNumPending, strconv.FormatUint(pending, 10))
	}
	without := func(m *nats.Msg, hdr string) *nats.Msg { m.Header.Del(hdr); return m }
	with := func(m *nats.Msg, hdr, v string) *nats.Msg { m.Header.Set(hdr, v); return m }

	ask := scanReq{Seq: 1, NextBy: keyPrefix + ">", Batch: 10}
	for i, c := range []struct {
		name string
		req  scanReq
		// answer is what the responder sends; none subscribes when nil.
		answer []*nats.Msg
		// parse: "dead" and "keyed" read the messages as the listing
		// and the read-ahead do; "" takes any.
		parse   string
		seqs    []uint64
		end     batchEnd
		refused string // in the error; or
		err     error  // what the error is
	}{
		{name: "a whole answer", answer: []*nats.Msg{plain(1, 0), plain(3, 1), eob(3, 2)},
			seqs: []uint64{1, 3}, end: batchEnd{last: 3, pending: 2}},
		{name: "none", answer: []*nats.Msg{status(statusNoMsg, "Description", "Message Not Found")}},
		{name: "the lane's dead letters", parse: "dead", req: scanReq{Seq: 2, NextBy: deadSubj, Batch: 2},
			answer: []*nats.Msg{msg(2, 0, deadSubj), msg(5, 2, deadSubj), eob(5, 0)}, seqs: []uint64{2, 5}, end: batchEnd{last: 5}},
		{name: "keys of the lane", parse: "keyed", answer: []*nats.Msg{plain(1, 0), msg(2, 1, keyPrefix+"b"), eob(2, 0)},
			seqs: []uint64{1, 2}, end: batchEnd{last: 2}},

		{name: "no responders", err: errNoDirect},
		{name: "no batch", answer: []*nats.Msg{without(without(plain(1, 0), hdrNumPending), hdrLastSeq)}, err: errNoBatch},

		{name: "first message lost", answer: []*nats.Msg{plain(3, 1), eob(3, 0)}, refused: "missing"},
		{name: "a gap", answer: []*nats.Msg{plain(1, 0), plain(5, 3), eob(5, 0)}, refused: "missing"},
		{name: "a message without its last sequence", answer: []*nats.Msg{plain(1, 0), without(plain(3, 1), hdrLastSeq), eob(3, 0)}, refused: "missing"},
		{name: "EOB names another last", answer: []*nats.Msg{plain(1, 0), plain(3, 1), eob(4, 0)}, refused: "missing"},
		{name: "EOB without its last sequence", answer: []*nats.Msg{plain(1, 0), status(statusEOB)}, refused: "missing"},
		{name: "no EOB", answer: []*nats.Msg{plain(1, 0), plain(3, 1)}, err: context.DeadlineExceeded},
		{name: "404 after a message", answer: []*nats.Msg{plain(1, 0), status(statusNoMsg)}, refused: "status 404"},
		{name: "no responders after a message", answer: []*nats.Msg{plain(1, 0), status(statusNoResponders)}, refused: "status 503"},
		{name: "408", answer: []*nats.Msg{status("408", "Description", "Bad Request")}, refused: "status 408 Bad Request"},
		{name: "no batch after a message", answer: []*nats.Msg{plain(1, 0), without(plain(3, 1), hdrNumPending)}, refused: hdrNumPending},
		{name: "a sequence going back", answer: []*nats.Msg{plain(3, 0), plain(2, 3), eob(2, 0)}, refused: "bad " + hdrStreamSeq},
		{name: "a sequence before the one asked", req: scanReq{Seq: 5, NextBy: keyPrefix + ">", Batch: 10},
			answer: []*nats.Msg{plain(2, 0), eob(2, 0)}, refused: "bad " + hdrStreamSeq},
		{name: "no sequence", answer: []*nats.Msg{with(plain(1, 0), hdrStreamSeq, "x"), eob(1, 0)}, refused: "bad " + hdrStreamSeq},
		{name: "more than asked", req: scanReq{Seq: 1, NextBy: keyPrefix + ">", Batch: 2},
			answer: []*nats.Msg{plain(1, 0), plain(2, 1), plain(3, 2), eob(3, 0)}, refused: "more than 2"},
		{name: "a dead letter of another lane", parse: "dead", req: scanReq{Seq: 1, NextBy: deadSubj, Batch: 10},
			answer: []*nats.Msg{msg(1, 0, deadSubj), msg(2, 1, DeadSubject("other")), eob(2, 0)}, refused: "on subject"},
		{name: "not a key of the lane", parse: "keyed", answer: []*nats.Msg{msg(1, 0, "throttle.demo.k"), eob(1, 0)}, refused: "not a key of the lane"},
		{name: "a keyed message without its time", parse: "keyed", answer: []*nats.Msg{without(plain(1, 0), hdrStreamTime), eob(1, 0)}, refused: hdrStreamTime},
	} {
		t.Run(c.name, func(t *testing.T) {
			stream := "FAKE" + strconv.Itoa(i)
			if c.answer != nil {
				sub, err := fake.Subscribe("$JS.API.DIRECT.GET."+stream, func(req *nats.Msg) {
					for _, a := range c.answer {
						a.Subject = req.Reply
						_ = fake.PublishMsg(a)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = sub.Unsubscribe() }()
				if err := fake.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			req := c.req
			if req.Batch == 0 {
				req = ask
			}
			within := 5 * time.Second
			if errors.Is(c.err, context.DeadlineExceeded) {
				within = 300 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			var p replies
			defer p.stop()
			var seqs []uint64
			var end batchEnd
			var err error
			switch c.parse {
			case "dead":
				var dead []api.DeadLetter
				dead, end, err = batchGet(ctx, &p, nc, stream, req, deadParser(deadSubj))
				for _, d := range dead {
					seqs = append(seqs, d.Seq)
				}
			case "keyed":
				var msgs []keyedMsg
				msgs, end, err = batchGet(ctx, &p, nc, stream, req, aheadParser(keyPrefix))
				for _, m := range msgs {
					seqs = append(seqs, m.seq)
				}
			default:
				seqs, end, err = batchGet(ctx, &p, nc, stream, req, func(seq uint64, _ *nats.Msg) (uint64, error) { return seq, nil })
			}
			switch {
			case c.refused != "":
				if err == nil || !strings.Contains(err.Error(), c.refused) || errors.Is(err, errNoBatch) || errors.Is(err, errNoDirect) {
					t.Fatalf("%v, %v: want it refused (%q)", seqs, err, c.refused)
				}
			case c.err != nil:
				if !errors.Is(err, c.err) {
					t.Fatalf("%v, %v: want %v", seqs, err, c.err)
				}
			case err != nil || !reflect.DeepEqual(seqs, c.seqs) || end != c.end:
				t.Fatalf("%v, end %+v, %v; want %v, end %+v", seqs, end, err, c.seqs, c.end)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.calls) != 0 {
				t.Fatalf("%d requests still wait for answers", len(p.calls))
			}
		})
	}
}
