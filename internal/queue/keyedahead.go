package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Reading a keyed lane ahead, many keys in one request.
//
// A key's next job is the first message of its subject at or after the
// key's cursor. Read one by one, that is a direct get per job. Instead the
// reader reads the lane's stream in order, across every key's subject, a
// batch of messages per request (a batch direct get, ADR-31: next_by_subj
// with a wildcard, seq, batch, max_bytes, answered by the messages and a
// 204 EOB status). Such a scan from sequence lo up to hi tells, for every
// key, all its messages stored in [lo, hi]: sequences only grow, so no
// message stored later can fall in that range, and one deleted since is
// one this reader deleted (settled) or, once the key changed hands,
// another instance did. So:
//
//   - a key's read at a cursor in [lo, hi+1] is answered from the scan,
//     and a read at hi+1 extends the scan (while it holds fewer than
//     aheadMax messages and aheadBytes);
//   - a job settled here leaves the scan at once (deleteAsync);
//   - a key's messages are kept only when this instance has held the key
//     since before the request was sent (KeyedReader.Holds): another
//     instance may settle the others' jobs meanwhile, so such a key, and
//     a key given up since (Settling), is read by itself until the scan
//     starts again;
//   - the scan starts again aheadFor after it began, from the cursor of
//     the read that finds it stale: nothing read is trusted longer.
//
// A server that answers no batch (before nats-server 2.11: one message,
// with no Nats-Num-Pending) makes the reader read each key by itself, as
// before. The reads under way at once share one subscription (a wildcard
// inbox, one token per request).

// Bounds of reading ahead.
const (
	// scanBatch and scanBytes bound one scan request (the server stops
	// after the message that passes scanBytes); a scan starts at
	// scanFirst messages and doubles its request as it goes on, so that a
	// slow lane, which uses a few messages before the scan goes stale,
	// does not read hundreds.
	scanBatch = 4096
	scanFirst = 32
	scanBytes = 4 << 20
	// aheadMax and aheadBytes bound what a scan holds, for every key.
	aheadMax   = 16384
	aheadBytes = 16 << 20
	// aheadFor is how long a scan is trusted after it began.
	aheadFor = 2 * time.Second
)

// Headers of a batch direct get's answers (ADR-31).
const (
	hdrStatus     = "Status"
	hdrNumPending = "Nats-Num-Pending"
	hdrLastSeq    = "Nats-Last-Sequence"
	hdrStreamSeq  = "Nats-Sequence"
	hdrStreamSubj = "Nats-Subject"
	hdrStreamTime = "Nats-Time-Stamp"
	statusEOB     = "204"
	statusNoMsg   = "404"
)

// aheadMsg is one message read ahead.
type aheadMsg struct {
	seq  uint64
	hdr  nats.Header
	data []byte
	at   time.Time
	size int // its payload and headers, as received
}

// ahead is what the scan read, as of its start at born: every live message
// with a sequence in [lo, hi] of every key not in void, by key in order.
type ahead struct {
	mu     sync.Mutex
	lo, hi uint64 // hi < lo: nothing read yet
	born   time.Time
	keys   map[string][]aheadMsg
	void   map[string]struct{}
	n      int
	bytes  int
	// batch is the next request's size.
	batch int
	// scanning lets one scan request be under way at a time.
	scanning sync.Mutex
	// noBatch: the server answered a batch request with one message.
	noBatch atomic.Bool
	// scans counts the scan requests answered (tests, figures).
	scans atomic.Uint64
}

func newAhead() *ahead {
	return &ahead{keys: map[string][]aheadMsg{}, void: map[string]struct{}{}}
}

// restart forgets the scan; the next one begins at from. a.mu is held.
func (a *ahead) restart(from uint64, now time.Time) {
	a.lo, a.hi, a.born = from, from-1, now
	clear(a.keys)
	clear(a.void)
	a.n, a.bytes, a.batch = 0, 0, 0
}

// stale reports whether the scan is too old to answer from. a.mu is held.
func (a *ahead) stale(now time.Time) bool { return now.Sub(a.born) >= aheadFor }

// find answers key's first live message at or after from out of the scan
// (skip tells messages being settled). Without one, next is where a scan
// would go on to answer it (the first sequence it does not cover, or from
// when it starts again), and scan says whether a scan can answer the key
// at all (not a key given up, nor a cursor out of its range).
func (a *ahead) find(key string, from uint64, now time.Time, skip func(uint64) bool) (m *aheadMsg, next uint64, scan bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stale(now) || a.hi < a.lo {
		return nil, from, true
	}
	if _, gone := a.void[key]; gone || from < a.lo || from > a.hi+1 {
		return nil, from, false
	}
	for _, mm := range a.keys[key] {
		if mm.seq >= from && !skip(mm.seq) {
			return &mm, 0, false
		}
	}
	return nil, a.hi + 1, true
}

// drop forgets key's message seq (settled here).
func (a *ahead) drop(key string, seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	msgs := a.keys[key]
	for i := range msgs {
		if msgs[i].seq == seq {
			a.n--
			a.bytes -= msgs[i].size
			a.keys[key] = append(msgs[:i:i], msgs[i+1:]...)
			if len(a.keys[key]) == 0 {
				delete(a.keys, key)
			}
			return
		}
	}
}

// forget stops answering key out of the scan until it starts again (the
// key is given up: another instance may settle its jobs).
func (a *ahead) forget(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forgetLocked(key)
}

// errNoBatch says the server answered a batch request with one message.
var errNoBatch = errors.New("the server answers no batch direct get")

// scanReq is a batch direct get's request (nats-server's JSApiMsgGetRequest).
type scanReq struct {
	Seq      uint64 `json:"seq"`
	NextBy   string `json:"next_by_subj"`
	Batch    int    `json:"batch,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// scan extends the scan from from (the first sequence it does not cover,
// or where a stale one starts again) and reports whether it covers from
// now; none says the lane has no message at or after from. It does
// nothing (covered false) while another scan is under way.
func (r *KeyedReader) scan(ctx context.Context, from uint64) (covered, none bool, err error) {
	a := r.ahead
	if a.noBatch.Load() {
		return false, false, nil
	}
	// A read that finds another scan under way reads its key alone rather
	// than wait for it: a scan of thousands of messages takes longer than
	// a direct get, and a read beside a round trip of its own (the Redis
	// pacer's lease) would make it the longer one.
	if !a.scanning.TryLock() {
		return false, false, nil
	}
	defer a.scanning.Unlock()
	now := time.Now()
	a.mu.Lock()
	switch {
	case a.stale(now) || a.hi < a.lo:
		a.restart(from, now)
	case from >= a.lo && from <= a.hi:
		a.mu.Unlock()
		return true, false, nil // another read extended it meanwhile
	case from != a.hi+1 || a.n >= aheadMax || a.bytes >= aheadBytes:
		a.mu.Unlock()
		return false, false, nil
	}
	born := a.born
	a.batch = min(max(2*a.batch, scanFirst), r.scanBatch)
	batch := a.batch
	a.mu.Unlock()

	prefix := InternalSubject(r.ls.spec.Name, "") + "."
	sent := time.Now()
	msgs, last, err := r.batchGet(ctx, scanReq{Seq: from, NextBy: prefix + ">", Batch: batch, MaxBytes: scanBytes})
	if errors.Is(err, errNoBatch) {
		a.noBatch.Store(true)
		r.q.log.Info("the NATS server answers no batch direct get; keyed lane reads one job per request", "lane", r.ls.spec.Name)
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	a.scans.Add(1)
	if len(msgs) == 0 {
		return false, true, nil
	}
	// Which keys this instance has held since before the request: the
	// others' jobs may have been settled by another instance while the
	// server read them. A key taken since is read by itself until the
	// scan starts again.
	var notHeld map[string]bool
	if r.Holds != nil {
		notHeld = map[string]bool{}
		for _, m := range msgs {
			if _, seen := notHeld[m.key]; !seen {
				notHeld[m.key] = !r.Holds(m.key, sent)
			}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.born != born || from != a.hi+1 {
		return false, false, nil // restarted meanwhile (a stale read)
	}
	for _, m := range msgs {
		key := m.key
		if _, gone := a.void[key]; gone {
			continue
		}
		if notHeld[key] {
			a.forgetLocked(key)
			continue
		}
		a.keys[key] = append(a.keys[key], m.aheadMsg)
		a.n++
		a.bytes += m.size
	}
	a.hi = last
	return true, false, nil
}

// forgetLocked is forget with a.mu held.
func (a *ahead) forgetLocked(key string) {
	if msgs, ok := a.keys[key]; ok {
		for _, m := range msgs {
			a.n--
			a.bytes -= m.size
		}
		delete(a.keys, key)
	}
	a.void[key] = struct{}{}
}

// keyedMsg is a message of a batch answer with its key.
type keyedMsg struct {
	key string
	aheadMsg
}

// batchGet sends one batch direct get and gathers its answers until the
// EOB; last is the highest sequence the answer covers (the last message
// sent). It returns errNoBatch when the server answered with one message
// and no Nats-Num-Pending (a server without batch gets).
func (r *KeyedReader) batchGet(ctx context.Context, req scanReq) (msgs []keyedMsg, last uint64, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, 0, err
	}
	call, reply, err := r.inbox.open(r.q.nc, max(req.Batch, 1))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: lane %s: %v", ErrUnavailable, r.ls.spec.Name, err)
	}
	defer r.inbox.close(call)
	subj := "$JS.API.DIRECT.GET." + r.ls.stream.CachedInfo().Config.Name
	if err := r.q.nc.PublishRequest(subj, reply, body); err != nil {
		return nil, 0, fmt.Errorf("%w: lane %s: %v", ErrUnavailable, r.ls.spec.Name, err)
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("%w: read lane %s ahead: %v", ErrUnavailable, r.ls.spec.Name, ctx.Err())
	}
	// The answers are complete: deliver adds none after done closed.
	got := call.msgs
	if call.over {
		return nil, 0, fmt.Errorf("%w: read lane %s ahead: more than %d messages", ErrUnavailable, r.ls.spec.Name, req.Batch)
	}
	msgs, last, err = readBatch(got, InternalSubject(r.ls.spec.Name, "")+".")
	if err != nil && !errors.Is(err, errNoBatch) {
		return nil, 0, fmt.Errorf("%w: read lane %s ahead: %v", ErrUnavailable, r.ls.spec.Name, err)
	}
	return msgs, last, err
}

// readBatch reads the answers of a batch direct get, in the order they
// came, up to its EOB; last is the highest sequence the answer covers.
// Each message names the one sent before it (Nats-Last-Sequence, 0 on the
// first): an answer whose first messages were lost (a reconnect while the
// server was sending it) or with a gap is refused, not trusted for a range
// it did not show.
func readBatch(got []*nats.Msg, prefix string) (msgs []keyedMsg, last uint64, err error) {
	prev := uint64(0)
	for i, m := range got {
		if len(m.Data) == 0 && m.Header.Get(hdrStatus) != "" {
			switch m.Header.Get(hdrStatus) {
			case statusEOB:
				if i != len(got)-1 {
					return nil, 0, errors.New("EOB before the last answer")
				}
				ls, _ := strconv.ParseUint(m.Header.Get(hdrLastSeq), 10, 64)
				if len(msgs) > 0 {
					last = max(msgs[len(msgs)-1].seq, ls)
				}
				return msgs, last, nil
			case statusNoMsg:
				return nil, 0, nil
			default:
				return nil, 0, fmt.Errorf("status %s %s", m.Header.Get(hdrStatus), m.Header.Get("Description"))
			}
		}
		if m.Header.Get(hdrNumPending) == "" {
			return nil, 0, errNoBatch
		}
		km, err := parseAhead(m, prefix)
		if err != nil {
			return nil, 0, err
		}
		if ls, err := strconv.ParseUint(m.Header.Get(hdrLastSeq), 10, 64); err != nil || ls != prev {
			return nil, 0, fmt.Errorf("message %d follows %q, not %d: part of the answer is missing", km.seq, m.Header.Get(hdrLastSeq), prev)
		}
		if km.seq <= prev {
			return nil, 0, fmt.Errorf("sequence %d after %d", km.seq, prev)
		}
		msgs = append(msgs, km)
		prev = km.seq
	}
	return nil, 0, errors.New("the answer ended without EOB")
}

// parseAhead reads a direct get's answer: its sequence, subject (a key of
// the lane: prefix and a valid key) and time from its headers.
func parseAhead(m *nats.Msg, prefix string) (keyedMsg, error) {
	seq, err := strconv.ParseUint(m.Header.Get(hdrStreamSeq), 10, 64)
	if err != nil || seq == 0 {
		return keyedMsg{}, fmt.Errorf("bad %s header %q", hdrStreamSeq, m.Header.Get(hdrStreamSeq))
	}
	at, err := time.Parse(time.RFC3339Nano, m.Header.Get(hdrStreamTime))
	if err != nil {
		return keyedMsg{}, fmt.Errorf("bad %s header: %v", hdrStreamTime, err)
	}
	key, ok := strings.CutPrefix(m.Header.Get(hdrStreamSubj), prefix)
	if !ok || ValidKey(key) != nil {
		return keyedMsg{}, fmt.Errorf("message %d on subject %q, not a key of the lane", seq, m.Header.Get(hdrStreamSubj))
	}
	size := len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	return keyedMsg{key: key, aheadMsg: aheadMsg{seq: seq, hdr: m.Header, data: m.Data, at: at, size: size}}, nil
}

// replies is one wildcard inbox subscription shared by the reads under way:
// each request has a token; its answers are gathered on the subscription's
// goroutine and handed over at once when the last one came (one wake-up
// per request, not one per message).
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
	status := len(m.Data) == 0 && m.Header.Get(hdrStatus) != ""
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
