package queue

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
)

// Read-ahead: jobs a drain has fetched and not yet given a slot.
//
// A queued job's eta_ms counts the jobs ahead of it that no drain has
// fetched (Ahead: the stream sequences past the consumer's delivered
// position) and the slots already reserved (the bucket's state). A job a
// drain has fetched and not yet given a slot is in neither: it is past the
// delivered position, and its slot is not reserved yet. Each drain reads a
// batch ahead, so at 20/s every instance holds one or two such jobs, and an
// estimate without them was short by a period for each (50 to 200 ms on
// the README's burst, one instance to three).
//
// Each Consumer counts its own (fetched, not slotted, not settled; the
// lane tells it a slot with Msg.Slotted). Ahead adds this instance's count,
// exact, and the other instances' as they last shared it: ShareReadAhead
// publishes an instance's count on a core NATS subject of the throttler's
// own, ReadAheadSubject, whenever it changed and at least every
// readAheadBeat while it is not zero; a count not heard for readAheadTTL
// (an instance gone) is dropped.

// ReadAheadPrefix starts the subject on which instances share their
// lanes' read-ahead counts; it is under the throttler's own subjects,
// which publishers may not write (docs/OPERATIONS.md).
const ReadAheadPrefix = "throttler.readahead."

// ReadAheadSubject is lane's read-ahead subject.
func ReadAheadSubject(lane string) string { return ReadAheadPrefix + lane }

const (
	// readAheadTick is how often a count is looked at for a change.
	readAheadTick = 20 * time.Millisecond
	// readAheadBeat is how often a count that is not zero is sent again.
	readAheadBeat = 250 * time.Millisecond
	// readAheadTTL drops a count not heard again within it.
	readAheadTTL = time.Second
	// maxReadAheadMsg bounds a read-ahead message read; maxReadAhead one
	// count believed.
	maxReadAheadMsg = 256
	maxReadAhead    = 1_000_000
)

// readAheadMsg is one instance's count of one lane, on the wire.
type readAheadMsg struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	N  int64  `json:"n"`
}

// readAheadCount is another instance's count as last heard.
type readAheadCount struct {
	n  int64
	at time.Time
}

// Msg states for the read-ahead count.
const (
	msgUncounted int32 = iota // not a fetched job of a lane consumer
	msgUnslotted              // fetched, counted, no slot yet
	msgSlotted                // given a slot, or settled: no longer counted
)

// Slotted tells the job's consumer that the drain gave it a slot: it no
// longer counts as read ahead. Safe to call more than once.
func (m *Msg) Slotted() {
	if m.ra.CompareAndSwap(msgUnslotted, msgSlotted) {
		m.c.unslotted.Add(-1)
	}
}

// ReadAhead is how many jobs this consumer fetched and has not yet seen
// given a slot or settled.
func (c *Consumer) ReadAhead() int64 { return c.unslotted.Load() }

// readAheadOf adds up the lane's read-ahead: this instance's consumer's,
// and the other instances' counts heard within readAheadTTL.
func (ls *laneState) readAheadOf(now time.Time) int64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var n int64
	if ls.local != nil {
		n = ls.local.unslotted.Load()
	}
	for id, c := range ls.others {
		if now.Sub(c.at) >= readAheadTTL {
			delete(ls.others, id)
			continue
		}
		n += c.n
	}
	return n
}

// ShareReadAhead shares c's read-ahead count of lane with the other
// instances, and hears theirs, until ctx ends (run it beside the drain).
func (q *Queue) ShareReadAhead(ctx context.Context, lane string, c *Consumer) {
	ls, err := q.lane(lane)
	if err != nil || c == nil {
		return
	}
	subject := ReadAheadSubject(lane)
	sub, err := q.nc.Subscribe(subject, func(m *nats.Msg) { ls.heard(q.id, m.Data, time.Now()) })
	if err != nil {
		q.log.Warn("read-ahead counts not shared; queued answers of other instances may be short", "lane", lane, "err", err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	send := func(n int64) {
		b, _ := json.Marshal(readAheadMsg{V: 1, ID: q.id, N: n})
		_ = q.nc.Publish(subject, b)
	}
	t := time.NewTicker(readAheadTick)
	defer t.Stop()
	var last int64
	var sent time.Time
	for {
		select {
		case <-ctx.Done():
			if last != 0 {
				send(0)
			}
			return
		case now := <-t.C:
			if n := c.unslotted.Load(); n != last || (n != 0 && now.Sub(sent) >= readAheadBeat) {
				send(n)
				last, sent = n, now
			}
		}
	}
}

// heard keeps another instance's count from a read-ahead message; its
// own (self), malformed or out-of-bounds ones are ignored.
func (ls *laneState) heard(self string, data []byte, now time.Time) {
	if len(data) > maxReadAheadMsg {
		return
	}
	var m readAheadMsg
	if json.Unmarshal(data, &m) != nil || m.V != 1 || m.ID == "" || len(m.ID) > 64 || m.ID == self || m.N < 0 || m.N > maxReadAhead {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if m.N == 0 {
		delete(ls.others, m.ID)
		return
	}
	if ls.others == nil {
		ls.others = map[string]readAheadCount{}
	}
	if _, ok := ls.others[m.ID]; ok || len(ls.others) < maxInstances {
		ls.others[m.ID] = readAheadCount{n: m.N, at: now}
	}
}

// maxInstances bounds the other instances whose counts a lane keeps.
const maxInstances = 1024

// counted marks m, a job fetched by a lane consumer, as read ahead.
func (c *Consumer) counted(m *Msg) {
	m.ra.Store(msgUnslotted)
	c.unslotted.Add(1)
}
