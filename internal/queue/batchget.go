package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Batch direct gets (ADR-31), read one way by every caller.
//
// A batch direct get asks a stream with direct gets for up to batch
// messages of the subjects next_by_subj names (a wildcard too) from seq on,
// bounded by max_bytes (the server stops after the message that passes
// it). The server answers on the request's reply subject with the
// messages, each naming the messages of those subjects still after it
// (Nats-Num-Pending) and the one sent before it (Nats-Last-Sequence, 0 on
// the first), then a 204 EOB status naming the last one sent and how many
// remain; a 404 when there is none at all, a 408 for a request it cannot
// read. No responders (503) says the stream answers no direct gets
// (AllowDirect off), and a server without batch gets (before nats-server
// 2.11) answers with one message without Nats-Num-Pending.
//
// batchGet sends the request and gathers its answers on an inbox shared by
// the requests under way (replies: one subscription, a token per request,
// one wake-up per answer); readBatch checks them as a chain, so that an
// answer with a message lost (a reconnect while the server sent it) is
// refused rather than trusted for a range it did not show, and hands each
// message to its caller's parse: what a message must be (a key of the
// lane, a dead letter of the lane) and what to do when a stream answers no
// batch is the caller's.

// Headers and statuses of a batch direct get's answers (ADR-31).
const (
	hdrStatus          = "Status"
	hdrNumPending      = "Nats-Num-Pending"
	hdrLastSeq         = "Nats-Last-Sequence"
	hdrStreamSeq       = "Nats-Sequence"
	hdrStreamSubj      = "Nats-Subject"
	hdrStreamTime      = "Nats-Time-Stamp"
	statusEOB          = "204"
	statusNoMsg        = "404"
	statusNoResponders = "503"
)

var (
	// errNoBatch says the server answered a batch request with one
	// message without Nats-Num-Pending: it has no batch gets.
	errNoBatch = errors.New("the server answers no batch direct get")
	// errNoDirect says the stream answers no direct get (no responders).
	errNoDirect = errors.New("no direct get: no responders")
)

// scanReq is a message get's or a direct get's request (nats-server's
// JSApiMsgGetRequest).
type scanReq struct {
	Seq      uint64 `json:"seq"`
	NextBy   string `json:"next_by_subj"`
	Batch    int    `json:"batch,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// batchEnd is what a batch answer's EOB says: last is the sequence of the
// last message sent (0 when none was), pending how many messages of the
// request's subjects remain after it.
type batchEnd struct {
	last, pending uint64
}

// batchGet sends req to stream's direct get, with its answers gathered on
// p, and reads them (readBatch): the messages parse made of them, in
// order, and the EOB. None, and no error, when the stream holds no message
// of req's subjects from req.Seq on. errNoDirect and errNoBatch say the
// stream answers no batch, and nothing was read; any other error refuses
// the answer.
func batchGet[T any](ctx context.Context, p *replies, nc *nats.Conn, stream string, req scanReq, parse func(seq uint64, m *nats.Msg) (T, error)) ([]T, batchEnd, error) {
	got, err := p.request(ctx, nc, "$JS.API.DIRECT.GET."+stream, req)
	if err != nil {
		return nil, batchEnd{}, err
	}
	return readBatch(got, req.Seq, parse)
}

// readBatch reads the answers of a batch direct get asked from sequence
// from, in the order they came, up to the status that ends them. Each
// message must follow the one before it (Nats-Last-Sequence: 0 on the
// first), at a higher sequence not below from, and the EOB name the last
// one: an answer whose first messages were lost, with a gap, or that
// stops without its EOB is refused. A 404 or no responders is an answer
// only in place of the first message. parse makes a message into the
// caller's value or refuses it.
func readBatch[T any](got []*nats.Msg, from uint64, parse func(seq uint64, m *nats.Msg) (T, error)) ([]T, batchEnd, error) {
	out := make([]T, 0, len(got))
	prev := uint64(0)
	for i, m := range got {
		if status := statusOf(m); status != "" {
			switch {
			case i != len(got)-1:
				return nil, batchEnd{}, fmt.Errorf("status %s before the last answer", status)
			case status == statusEOB:
				if ls, _ := strconv.ParseUint(m.Header.Get(hdrLastSeq), 10, 64); ls != prev {
					return nil, batchEnd{}, fmt.Errorf("the answer ends after %d, not %d: part of it is missing", ls, prev)
				}
				pending, _ := strconv.ParseUint(m.Header.Get(hdrNumPending), 10, 64)
				return out, batchEnd{last: prev, pending: pending}, nil
			case status == statusNoMsg && prev == 0:
				return nil, batchEnd{}, nil
			case status == statusNoResponders && prev == 0:
				return nil, batchEnd{}, errNoDirect
			}
			return nil, batchEnd{}, fmt.Errorf("status %s %s after %d", status, m.Header.Get("Description"), prev)
		}
		if m.Header.Get(hdrNumPending) == "" {
			if prev == 0 {
				return nil, batchEnd{}, errNoBatch
			}
			return nil, batchEnd{}, fmt.Errorf("a message without %s after %d in a batch answer", hdrNumPending, prev)
		}
		seq, err := strconv.ParseUint(m.Header.Get(hdrStreamSeq), 10, 64)
		if err != nil || seq <= prev || seq < from {
			return nil, batchEnd{}, fmt.Errorf("bad %s header %q after %d, asked from %d", hdrStreamSeq, m.Header.Get(hdrStreamSeq), prev, from)
		}
		if ls, err := strconv.ParseUint(m.Header.Get(hdrLastSeq), 10, 64); err != nil || ls != prev {
			return nil, batchEnd{}, fmt.Errorf("message %d follows %q, not %d: part of the answer is missing", seq, m.Header.Get(hdrLastSeq), prev)
		}
		v, err := parse(seq, m)
		if err != nil {
			return nil, batchEnd{}, err
		}
		out = append(out, v)
		prev = seq
	}
	return nil, batchEnd{}, errors.New("the answer ended without EOB")
}

// statusOf is m's status when m is one (no payload, a Status header), ""
// when it is a message.
func statusOf(m *nats.Msg) string {
	if len(m.Data) != 0 {
		return ""
	}
	return m.Header.Get(hdrStatus)
}

// replies is one wildcard inbox subscription shared by the requests under
// way: each request has a token; its answers are gathered on the
// subscription's goroutine and handed over at once when the last one came
// (one wake-up per request, not one per message). The zero value makes
// its subscription at the first request.
type replies struct {
	mu     sync.Mutex
	sub    *nats.Subscription
	prefix string
	next   uint64
	calls  map[string]*call
}

// call gathers one request's answers: up to max messages and the status
// that ends them (EOB, an error); done closes after the last one. over
// says more came than asked for.
type call struct {
	tok  string
	max  int
	msgs []*nats.Msg
	over bool
	done chan struct{}
}

// request sends a batch request (req, batch messages at most) to subj and
// returns its answers once the last one came (deliver).
func (p *replies) request(ctx context.Context, nc *nats.Conn, subj string, req scanReq) ([]*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // nobody would wait for the answer
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	c, reply, err := p.open(nc, max(req.Batch, 1))
	if err != nil {
		return nil, err
	}
	defer p.close(c)
	if err := nc.PublishRequest(subj, reply, body); err != nil {
		return nil, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The answers are complete: deliver adds none after done closed.
	if c.over {
		return nil, fmt.Errorf("more than %d messages", req.Batch)
	}
	return c.msgs, nil
}

// open returns a request's call (room for n messages and the EOB) and its
// reply subject; the subscription is made at the first request.
func (p *replies) open(nc *nats.Conn, n int) (*call, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sub == nil || !p.sub.IsValid() {
		prefix := nc.NewInbox() + "."
		sub, err := nc.Subscribe(prefix+"*", p.deliver)
		if err != nil {
			return nil, "", err
		}
		// Answers are gathered as they come, never dropped by the client.
		_ = sub.SetPendingLimits(-1, -1)
		p.sub, p.prefix = sub, prefix
		if p.calls == nil {
			p.calls = map[string]*call{}
		}
	}
	p.next++
	c := &call{tok: strconv.FormatUint(p.next, 36), max: n, done: make(chan struct{})}
	p.calls[c.tok] = c
	return c, p.prefix + c.tok, nil
}

// close forgets a request: later answers are dropped.
func (p *replies) close(c *call) {
	p.mu.Lock()
	delete(p.calls, c.tok)
	p.mu.Unlock()
}

// deliver adds an answer to its request's call and ends the call at a
// status (EOB, not found, an error), at a message without batch headers
// (a server without batch gets answers one), or past the call's room. An
// answer with no call waiting is dropped.
func (p *replies) deliver(m *nats.Msg) {
	tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.calls[tok]
	if c == nil {
		return
	}
	status := statusOf(m) != ""
	if !status && len(c.msgs) >= c.max {
		c.over = true
	} else {
		c.msgs = append(c.msgs, m)
	}
	if status || c.over || m.Header.Get(hdrNumPending) == "" {
		delete(p.calls, tok)
		close(c.done)
	}
}

// stop ends the subscription (the lane stopped).
func (p *replies) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
		p.sub = nil
	}
}
