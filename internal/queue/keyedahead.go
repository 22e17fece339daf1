package queue

import (
	"context"
	"errors"
	"fmt"
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
// 204 EOB status; batchget.go reads it). Such a scan from sequence lo up to hi tells, for every
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
// before. The reads under way at once share one subscription (replies: a
// wildcard inbox, one token per request).

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
	req := scanReq{Seq: from, NextBy: prefix + ">", Batch: batch, MaxBytes: scanBytes}
	msgs, end, err := batchGet(ctx, &r.inbox, r.q.nc, r.ls.stream.CachedInfo().Config.Name, req, aheadParser(prefix))
	if errors.Is(err, errNoBatch) {
		a.noBatch.Store(true)
		r.q.log.Info("the NATS server answers no batch direct get; keyed lane reads one job per request", "lane", r.ls.spec.Name)
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("%w: read lane %s ahead: %v", ErrUnavailable, r.ls.spec.Name, err)
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
	a.hi = end.last
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

// aheadParser reads a message of a scan of the lane whose subjects begin
// with prefix (readBatch): its subject must be a key of the lane (prefix
// and a valid key); its time is read from its headers, and its size is its
// payload and headers, as received.
func aheadParser(prefix string) func(seq uint64, m *nats.Msg) (keyedMsg, error) {
	return func(seq uint64, m *nats.Msg) (keyedMsg, error) {
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
}
