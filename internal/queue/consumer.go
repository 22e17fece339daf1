package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Msg is one fetched job. Exactly one of Ack, Retry or Release must be called.
// Until then the consumer keeps it alive on the server (in-progress acks), so
// AckWait can stay short: a crashed instance's jobs come back quickly.
type Msg struct {
	job  Job
	m    acker
	meta *jetstream.MsgMetadata
	c    *Consumer
	// origin names the stream the message was read from, for the msg ids
	// of its copies (copy.go).
	origin string
	// maxAge is the lane's max_age (Expiry); 0: none.
	maxAge time.Duration
	// ra is the job's state in its consumer's read-ahead count
	// (readahead.go).
	ra atomic.Int32
}

// acker answers for one fetched message: a JetStream consumer's message, or
// a keyed lane's message read by subject (keyed.go).
type acker interface {
	Ack() error
	DoubleAck(context.Context) error
	Nak() error
	NakWithDelay(time.Duration) error
	InProgress() error
}

// Job is the stored job.
func (m *Msg) Job() Job { return m.job }

// AddAttempts counts n more failed attempts of the job than its message
// says (a keyed lane's ordered job retried in place).
func (m *Msg) AddAttempts(n int) { m.job.Attempts += n }

// Seq is the job's stream sequence.
func (m *Msg) Seq() uint64 { return m.meta.Sequence.Stream }

// Attempt is this delivery's attempt number: 1 for the first. Deliveries
// that a rate limit or a stop cut short do not count.
func (m *Msg) Attempt() int { return m.job.Attempts + 1 }

// StoredAt is when JetStream stored this copy of the job.
func (m *Msg) StoredAt() time.Time { return m.meta.Timestamp }

// EnqueuedAt is when the job was first stored: StoredAt, or for a retry
// when its first copy was.
func (m *Msg) EnqueuedAt() time.Time {
	if m.job.EnqueuedAt.IsZero() {
		return m.StoredAt()
	}
	return m.job.EnqueuedAt
}

// FirstDelivery reports that no consumer had this copy of the job before.
func (m *Msg) FirstDelivery() bool { return m.meta.NumDelivered <= 1 }

// Ack marks the job done; JetStream removes it. The ack is not confirmed:
// the server applies it moments later.
func (m *Msg) Ack() error { m.c.settle(m); m.c.leftLane(m); return m.m.Ack() }

// AckSync marks the job done and returns once the server has applied the
// ack: what a stopping instance uses, since a server shut down right after a
// plain ack may never apply it (an embedded server drops the acks it has
// not processed yet), and the job would be delivered again.
// It waits at most a second: a server that closed the consumer never answers.
func (m *Msg) AckSync(ctx context.Context) error {
	m.c.settle(m)
	m.c.leftLane(m)
	return confirmAck(ctx, m.m)
}

// Wait hands the job back to be delivered again after delay, in its place and
// without counting an attempt (a rate limit, a paused lane).
func (m *Msg) Wait(delay time.Duration) error { m.c.settle(m); return m.m.NakWithDelay(delay) }

// Release hands the job back at once, unstarted.
func (m *Msg) Release() error { m.c.settle(m); return m.m.Nak() }

// Consumer reads one lane's jobs in stream order, for one drain goroutine at
// a time.
//
// Every job the server delivers is taken in (decoded and kept alive, see
// KeepAlive) as soon as it arrives, on a goroutine of the pull request's
// own, not when Next next asks: a pull request stays open after Next
// returned (up to FetchWait), and a job it brings while the drain takes
// nothing (an operator's hold, every permit busy) would otherwise sit in
// the client's buffer unread and unkept past AckWait, and the server would
// deliver it again beside the copy still in the buffer.
type Consumer struct {
	q       *Queue
	lane    string
	origin  string // the lane stream, for Msg.origin
	cons    jetstream.Consumer
	ackWait time.Duration
	// FetchWait is how long one pull request waits for jobs.
	FetchWait time.Duration
	// pulling is closed when the reader of the open pull request ended;
	// nil while none is open. Only Next and Close touch it.
	pulling chan struct{}
	// arrived is signalled (capacity 1) when the reader took a job in or
	// ended.
	arrived chan struct{}

	mu          sync.Mutex
	outstanding map[*Msg]time.Time // fetched, not yet settled → last touched
	// ready are the jobs taken in and not yet handed out by Next, in
	// order; pullErr is the error that ended the last pull request.
	ready   []*Msg
	pullErr error
	// handBack: jobs that arrive are handed back at once instead of
	// kept, until Next is called again (HandBack).
	handBack bool
	// unslotted counts the jobs fetched and not yet given a slot or
	// settled (readahead.go).
	unslotted atomic.Int64
	// inPlace: failed attempts of jobs waiting in place, by stream
	// sequence (inplace.go); guarded by mu. inPlaceN is its length.
	inPlace  map[uint64]inPlaceCount
	inPlaceN atomic.Int64
	// tries keeps them across instances and restarts (plain lanes).
	tries inPlaceTries
}

// Consumer returns the reader of lane's jobs.
func (q *Queue) Consumer(lane string) (*Consumer, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return nil, err
	}
	c := &Consumer{q: q, lane: lane, origin: origin(StreamName(lane), ls.epoch), cons: ls.consumer, FetchWait: time.Second, ackWait: ls.spec.AckWait,
		outstanding: map[*Msg]time.Time{}, arrived: make(chan struct{}, 1)}
	if !ls.keyed {
		c.tries.kv, c.tries.epoch = ls.tries, ls.epoch
	}
	ls.mu.Lock()
	ls.local = c
	ls.mu.Unlock()
	return c, nil
}

// Next blocks until at least one job is available (or ctx ends), then
// returns up to max jobs that are available without waiting further.
func (c *Consumer) Next(ctx context.Context, max int) ([]*Msg, error) {
	c.mu.Lock()
	c.handBack = false
	c.mu.Unlock()
	for {
		c.mu.Lock()
		n := min(len(c.ready), max)
		out := c.ready[:n:n]
		c.ready = c.ready[n:]
		err := c.pullErr
		c.pullErr = nil
		c.mu.Unlock()
		if n > 0 {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if c.pulling == nil {
			b, err := c.cons.Fetch(max, jetstream.FetchMaxWait(c.FetchWait))
			if err != nil {
				return nil, fmt.Errorf("queue: fetch %s: %w", c.lane, err)
			}
			done := make(chan struct{})
			c.pulling = done
			go c.takeIn(b, done)
		}
		select {
		case <-c.arrived:
		case <-c.pulling:
			// The pull request ended: what it brought is in ready (the
			// reader took it in before it ended); a new one is made
			// when nothing is.
			c.pulling = nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// takeIn takes in every job pull request b brings, as it arrives, until
// the request ends; then it closes done.
func (c *Consumer) takeIn(b jetstream.MessageBatch, done chan<- struct{}) {
	defer close(done)
	for m := range b.Messages() {
		msg := c.wrap(m)
		if msg == nil {
			continue
		}
		c.mu.Lock()
		back := c.handBack
		if !back {
			c.ready = append(c.ready, msg)
		}
		c.mu.Unlock()
		if back {
			_ = msg.Release()
			continue
		}
		select {
		case c.arrived <- struct{}{}:
		default:
		}
	}
	if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
		c.mu.Lock()
		c.pullErr = fmt.Errorf("queue: fetch %s: %w", c.lane, err)
		c.mu.Unlock()
	}
}

// notBeforeSlack lets a retry that is due within this much start now.
const notBeforeSlack = 5 * time.Millisecond

// wrap decodes a fetched message and tracks it until it is settled. It
// returns nil for a retry that is not due yet (handed back at once) and for
// a poison job (dead-lettered at once, poison.go).
func (c *Consumer) wrap(m jetstream.Msg) *Msg {
	meta, err := m.Metadata()
	if err != nil {
		meta = &jetstream.MsgMetadata{NumDelivered: 1}
	}
	c.q.fetched(c.lane, meta.Sequence.Stream)
	internal, _, _ := subjectKey(c.lane, m.Subject())
	if internal && m.Headers().Get(headerClaim) != "" {
		// A delayed job's claim on its id (schedule.go), fetched
		// before its writer deleted it: no job, and no failed attempts
		// to read.
		_ = m.Ack()
		return nil
	}
	msg := &Msg{job: jobFromMsg(c.lane, m, meta), m: m, meta: meta, c: c, origin: c.origin}
	msg.job.Attempts = max(msg.job.Attempts, c.attemptsInPlace(meta.Sequence.Stream, meta.NumDelivered))
	ls, lerr := c.q.lane(c.lane)
	if lerr == nil {
		msg.maxAge = ls.spec.MaxAge
	}
	if !internal && lerr == nil {
		applyPublicSchedule(&msg.job, m.Headers(), meta.Timestamp, ls.spec.MaxDelay)
		if reason := poisonReason(ls.spec, msg.job, false); reason != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 2*publishTimeout)
			_ = c.q.deadPoison(ctx, msg, ls.spec, reason, m.Subject())
			cancel()
			return nil
		}
		if !msg.job.NotBefore.IsZero() && time.Until(msg.job.NotBefore) > notBeforeSlack {
			// Its publisher asked for a delay: it waits in the retry
			// stream, holding no place of the lane's max_inflight.
			ctx, cancel := context.WithTimeout(context.Background(), 2*publishTimeout)
			err := c.q.schedulePublic(ctx, msg)
			cancel()
			if err != nil && !errors.Is(err, ErrAckUnconfirmed) {
				c.q.log.Warn("storing a delayed public job failed; trying again", "lane", c.lane, "seq", msg.Seq(), "err", err)
				_ = m.NakWithDelay(time.Second)
			}
			return nil
		}
		msg.job.NotBefore = time.Time{}
	}
	if msg.Expired(time.Now()) {
		// It waited in the lane past its expiry: dead-lettered before
		// it takes a slot.
		c.q.expireFetched(msg)
		return nil
	}
	if wait := time.Until(msg.job.NotBefore); wait > notBeforeSlack {
		// A retry that is not due yet: back to the queue until it is,
		// without a slot and without counting an attempt.
		_ = m.NakWithDelay(wait)
		return nil
	}
	c.mu.Lock()
	c.outstanding[msg] = time.Now()
	c.mu.Unlock()
	c.counted(msg)
	return msg
}

func (c *Consumer) settle(m *Msg) {
	m.Slotted()
	c.mu.Lock()
	delete(c.outstanding, m)
	c.mu.Unlock()
}

// KeepAlive sends an in-progress ack for every job held longer than a third
// of AckWait (waiting for its slot, or delivering to a slow target), until
// ctx ends. Run it beside the drain.
func (c *Consumer) KeepAlive(ctx context.Context) {
	every := c.ackWait / 3
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			var due []*Msg
			c.mu.Lock()
			for m, touched := range c.outstanding {
				if now.Sub(touched) >= every {
					due = append(due, m)
					c.outstanding[m] = now
				}
			}
			c.mu.Unlock()
			for _, m := range due {
				_ = m.m.InProgress()
			}
		}
	}
}

// Release hands msgs back to the queue at once, unstarted.
func (c *Consumer) Release(msgs []*Msg) {
	for _, m := range msgs {
		_ = m.Release()
	}
}

// HandBack hands back the jobs taken in and not yet handed out, and those
// the open pull request brings until Next is called again: for a reader
// that stops asking for a while (a pull-mode lane whose workers went
// elsewhere), so that its jobs go to another instance at once.
func (c *Consumer) HandBack() {
	c.mu.Lock()
	c.handBack = true
	left := c.ready
	c.ready = nil
	c.mu.Unlock()
	c.Release(left)
}

// Close hands back every job that was delivered but not yet taken, so
// another instance gets them at once. It waits at most until the open pull
// request expires (FetchWait). Call it after the last Next returned.
func (c *Consumer) Close() {
	if c.pulling != nil {
		<-c.pulling
		c.pulling = nil
	}
	c.mu.Lock()
	left := c.ready
	c.ready, c.pullErr = nil, nil
	c.mu.Unlock()
	c.Release(left)
}
