package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Keyed lanes: one FIFO per key, read by subject, with no consumer per key.
//
// A keyed lane's stream keeps limits retention (a work queue allows no
// reading by subject beside its consumer) and AllowDirect. Its jobs are
// stored on the internal subject of their key, throttler.lane.<lane>.<key>;
// a key's next job is read with a direct get of the next message on that
// subject at or after a cursor (next_by_subj + seq), and a job leaves the
// stream when it is settled (the message is deleted). So the oldest stored
// message of a key's subject is always its next job, and the stream's
// message count is still the lane's backlog (MaxMsgs = max_backlog holds).
//
// Jobs published on the public subjects, throttle.<lane>.<key>, are taken by
// one durable consumer per lane ("intake", shared by every instance): each is
// stored again on its key's internal subject (trusting nothing of it, as for
// unkeyed lanes) and then deleted. That keeps the trust boundary of
// intake.go and gives every job of a key one subject to read in order.

// IntakeConsumerName is the durable consumer of a keyed lane's public
// subjects.
const IntakeConsumerName = "intake"

// MaxKey is the longest key of a keyed lane, in bytes.
const MaxKey = 128

// ValidKey reports why k cannot be a key of a keyed lane: it must be 1 to
// MaxKey bytes of letters, digits and - _ . : @ = + ~, with no empty
// dot-separated part (a key is a part of a NATS subject).
func ValidKey(k string) error {
	if k == "" {
		return errors.New("the key is empty")
	}
	if len(k) > MaxKey {
		return fmt.Errorf("the key is %d bytes; at most %d are allowed", len(k), MaxKey)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.:@=+~", c) >= 0 {
			continue
		}
		return fmt.Errorf("the key has a byte 0x%02x at %d; only letters, digits and - _ . : @ = + ~ are allowed", c, i)
	}
	if k[0] == '.' || k[len(k)-1] == '.' || strings.Contains(k, "..") {
		return errors.New("the key has an empty part between dots")
	}
	return nil
}

// EnsureKeyedLane creates or updates a keyed lane's stream and its intake
// consumer. A lane whose stream is a work queue (it was not keyed before)
// is refused: JetStream cannot change a stream's retention.
func (q *Queue) EnsureKeyedLane(ctx context.Context, spec LaneSpec) error {
	if spec.Replicas == 0 {
		spec.Replicas = 1
	}
	name := StreamName(spec.Name)
	if st, err := q.js.Stream(ctx, name); err == nil {
		if st.CachedInfo().Config.Retention == jetstream.WorkQueuePolicy {
			return fmt.Errorf("queue: lane %s is keyed (per_key) but its stream %s was made for an unkeyed lane; "+
				"drain it and delete the stream (nats stream rm %s) before making the lane keyed", spec.Name, name, name)
		}
	}
	st, err := ensureStream(ctx, q.js, jetstream.StreamConfig{
		Name:        name,
		Description: "throttler keyed lane " + spec.Name,
		Subjects: []string{Subject(spec.Name, ""), Subject(spec.Name, ">"),
			InternalSubject(spec.Name, ""), InternalSubject(spec.Name, ">")},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     spec.MaxBacklog,
		MaxBytes:    maxBytes(spec.MaxBytes),
		Discard:     jetstream.DiscardNew,
		MaxMsgSize:  int32(spec.MaxBody + HeaderRoom),
		Duplicates:  spec.DedupWindow,
		Replicas:    spec.Replicas,
		AllowDirect: true,
	})
	if err != nil {
		return fmt.Errorf("queue: stream for keyed lane %s: %w", spec.Name, err)
	}
	intake, err := ensureConsumer(ctx, st, jetstream.ConsumerConfig{
		Durable:        IntakeConsumerName,
		Description:    "throttler intake of keyed lane " + spec.Name,
		FilterSubjects: []string{Subject(spec.Name, ""), Subject(spec.Name, ">")},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        30 * time.Second,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		MaxAckPending:  1024,
		MaxDeliver:     -1,
		Replicas:       spec.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: intake consumer for keyed lane %s: %w", spec.Name, err)
	}
	retry, err := q.ensureRetryConsumer(ctx, spec)
	if err != nil {
		return err
	}
	q.mu.Lock()
	q.lanes[spec.Name] = &laneState{spec: spec, stream: st, retry: retry, intake: intake, keyed: true}
	q.mu.Unlock()
	return nil
}

// OnStored registers f to hear the key of every job the throttler stores on
// keyed lane's internal subjects (intake, retries coming back, replays), right
// after JetStream confirmed it. f must be cheap and must not block.
func (q *Queue) OnStored(lane string, f func(key string)) {
	ls, err := q.lane(lane)
	if err != nil {
		return
	}
	ls.mu.Lock()
	ls.onStored = f
	ls.mu.Unlock()
}

// stored tells a keyed lane's listener that key has a new job.
func (ls *laneState) stored(key string) {
	if !ls.keyed {
		return
	}
	ls.mu.Lock()
	f := ls.onStored
	ls.mu.Unlock()
	if f != nil {
		f(key)
	}
}

// KeyedReader reads a keyed lane's jobs one key at a time. Safe for
// concurrent use.
type KeyedReader struct {
	q  *Queue
	ls *laneState
	c  *Consumer // settles the messages it hands out; never fetches
	// OnRequeue hears a message that was handed back unstarted or to
	// wait in place (Release, Wait): it is again its key's next job.
	OnRequeue func(key string, seq uint64)
}

// KeyedReader returns the reader of keyed lane's jobs.
func (q *Queue) KeyedReader(lane string) (*KeyedReader, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return nil, err
	}
	if !ls.keyed {
		return nil, fmt.Errorf("queue: lane %s is not keyed", lane)
	}
	return &KeyedReader{q: q, ls: ls, c: &Consumer{q: q, lane: lane, outstanding: map[*Msg]time.Time{}}}, nil
}

// getTimeout bounds one direct get.
const getTimeout = 2 * time.Second

// Next returns key's first stored job at or after the stream sequence from
// (1 for the oldest), or nil when there is none.
func (r *KeyedReader) Next(ctx context.Context, key string, from uint64) (*Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	raw, err := r.ls.stream.GetMsg(ctx, max(from, 1), jetstream.WithGetMsgSubject(InternalSubject(r.ls.spec.Name, key)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read key %s of lane %s: %v", ErrUnavailable, key, r.ls.spec.Name, err)
	}
	lane := r.ls.spec.Name
	job := decodeJob(lane, raw.Header, raw.Data, key, raw.Sequence, true, time.Now())
	if job.EnqueuedAt.IsZero() {
		job.EnqueuedAt = raw.Time
	}
	meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: raw.Sequence}, NumDelivered: 1, Timestamp: raw.Time, Stream: r.ls.stream.CachedInfo().Config.Name}
	return &Msg{job: job, m: &keyedAck{r: r, key: key, seq: raw.Sequence}, meta: meta, c: r.c}, nil
}

// Release hands msgs back unstarted: each is again its key's next job.
func (r *KeyedReader) Release(msgs []*Msg) {
	for _, m := range msgs {
		_ = m.Release()
	}
}

// Keys lists the keys with stored jobs (on the internal subjects), for a
// sweep at start and after a lost owner. It reads JetStream's per-subject
// counts (paged by the client).
func (r *KeyedReader) Keys(ctx context.Context) ([]string, error) {
	lane := r.ls.spec.Name
	info, err := r.ls.stream.Info(ctx, jetstream.WithSubjectFilter(InternalSubject(lane, ">")))
	if err != nil {
		return nil, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, lane, err)
	}
	prefix := InternalSubject(lane, "") + "."
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		if k, ok := strings.CutPrefix(subj, prefix); ok && ValidKey(k) == nil {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// keyedAck settles a message read by subject: done deletes it; handed back
// it stays, the oldest of its key again.
type keyedAck struct {
	r   *KeyedReader
	key string
	seq uint64
}

func (a *keyedAck) Ack() error {
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	defer cancel()
	err := a.r.ls.stream.DeleteMsg(ctx, a.seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		err = nil // settled twice (a former owner of the key): gone either way
	}
	return err
}

func (a *keyedAck) Nak() error { return a.NakWithDelay(0) }

func (a *keyedAck) NakWithDelay(time.Duration) error {
	if f := a.r.OnRequeue; f != nil {
		f(a.key, a.seq)
	}
	return nil
}

func (a *keyedAck) InProgress() error { return nil }

// RunIntake moves jobs published on a keyed lane's public subjects to their
// keys' internal subjects until ctx ends (every instance runs one; the shared
// consumer hands each message to one of them). A message without a valid key
// is dead-lettered with the reason.
func (q *Queue) RunIntake(ctx context.Context, lane string, log *slog.Logger) {
	ls, err := q.lane(lane)
	if err != nil || ls.intake == nil {
		return
	}
	for ctx.Err() == nil {
		batch, err := ls.intake.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() == nil {
				log.Debug("keyed intake fetch failed", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for m := range batch.Messages() {
			q.intakeOne(ctx, ls, m, log)
		}
	}
}

// PublicJobsWaiting counts jobs on a keyed lane's public subjects not yet
// moved to their keys.
func (q *Queue) PublicJobsWaiting(ctx context.Context, lane string) (uint64, error) {
	ls, err := q.lane(lane)
	if err != nil || ls.intake == nil {
		return 0, err
	}
	ci, err := ls.intake.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: intake consumer %s: %v", ErrUnavailable, lane, err)
	}
	return ci.NumPending + uint64(ci.NumAckPending), nil
}

func (q *Queue) intakeOne(ctx context.Context, ls *laneState, m jetstream.Msg, log *slog.Logger) {
	meta, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	lane, seq := ls.spec.Name, meta.Sequence.Stream
	_, key, _ := subjectKey(lane, m.Subject())
	job := decodeJob(lane, m.Headers(), m.Data(), key, seq, false, time.Now())
	job.Outside = false
	job.EnqueuedAt = meta.Timestamp
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	done := func() {
		_ = m.Ack()
		if err := ls.stream.DeleteMsg(pctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			log.Warn("deleting a moved public job failed", "seq", seq, "err", err)
		}
	}
	if kerr := ValidKey(key); kerr != nil {
		reason := "no Throttle-Key: a keyed lane's jobs are published on throttle." + lane + ".<key>"
		if key != "" {
			reason = "invalid Throttle-Key: " + kerr.Error()
		}
		c := &Consumer{q: q, lane: lane, outstanding: map[*Msg]time.Time{}}
		msg := &Msg{job: job, m: &intakeAck{m: m, done: done}, meta: meta, c: c}
		if err := msg.Dead(pctx, DeadInfo{Reason: reason}, time.Second); err != nil {
			log.Warn("dead-lettering a public job without a valid key failed", "seq", seq, "err", err)
			return
		}
		log.Warn("public job without a valid key dead-lettered", "seq", seq, "subject", m.Subject(), "reason", reason)
		return
	}
	// A repeat after a crash between store and delete is a duplicate.
	job.MsgID = fmt.Sprintf("%s#in-%d", job.ID, seq)
	job.Outside = true // counted as NATS intake when it starts
	if err := q.republish(pctx, job); err != nil {
		log.Warn("moving a public job to its key failed; trying again in 1s", "seq", seq, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	done()
}

// intakeAck settles an intake message that was dead-lettered.
type intakeAck struct {
	m    jetstream.Msg
	done func()
}

func (a *intakeAck) Ack() error                         { a.done(); return nil }
func (a *intakeAck) Nak() error                         { return a.m.Nak() }
func (a *intakeAck) NakWithDelay(d time.Duration) error { return a.m.NakWithDelay(d) }
func (a *intakeAck) InProgress() error                  { return a.m.InProgress() }

// HeaderVia says, on a keyed lane's internal copy of a job published on its
// public subject, that the job came in over NATS ("nats"): the lane counts
// it as NATS intake when it first starts.
const HeaderVia = "Throttler-Via"
