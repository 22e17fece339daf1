package queue

import (
	"context"
	"errors"
	"fmt"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/tracectx"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dead letters: jobs that used up their attempts or that a target refused for
// good. They live in one stream, THROTTLE_DEAD, subject throttle_dead.<lane>,
// with the reason and the last outcome in headers, until they are replayed,
// deleted, purged or age out.
const (
	DeadStream        = "THROTTLE_DEAD"
	DeadSubjectPrefix = "throttle_dead"

	HeaderDeadReason = "Throttler-Dead-Reason"
	HeaderLastStatus = "Throttler-Last-Status"
	HeaderLastError  = "Throttler-Last-Error"
	HeaderDeadAt     = "Throttler-Dead-At"
	HeaderLane       = "Throttler-Lane"
	HeaderKey        = "Throttler-Key"
)

// ErrNotFound: no dead letter with that sequence in that lane.
var ErrNotFound = errors.New("queue: dead letter not found")

// DeadSubject is the subject of a lane's dead letters.
func DeadSubject(lane string) string { return DeadSubjectPrefix + "." + lane }

// DeadConfig bounds the dead-letter stream.
type DeadConfig struct {
	// MaxAge drops dead letters older than this; 0 keeps them.
	MaxAge time.Duration
	// MaxBytes bounds the stream on disk; the oldest go first.
	MaxBytes int64
	Replicas int
}

// EnsureDeadLetters creates or updates the dead-letter stream.
func (q *Queue) EnsureDeadLetters(ctx context.Context, cfg DeadConfig) error {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	st, err := ensureStream(ctx, q.js, jetstream.StreamConfig{
		Name:        DeadStream,
		Description: "throttler dead letters",
		Subjects:    []string{DeadSubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    maxBytes(cfg.MaxBytes),
		Discard:     jetstream.DiscardOld,
		Replicas:    cfg.Replicas,
		// A page of the listing is one batch direct get (deadlist.go).
		AllowDirect: true,
	})
	if err != nil {
		return fmt.Errorf("queue: dead-letter stream: %w", err)
	}
	q.mu.Lock()
	q.dead, q.deadEpoch = st, st.CachedInfo().Created.UnixNano()
	q.mu.Unlock()
	return nil
}

// DeadInfo is why a job died.
type DeadInfo struct {
	Reason     string
	LastStatus int
	LastError  string
}

// Dead moves the job to the dead-letter stream and acks it in the lane. When
// the dead letter cannot be stored, or another message holds its msg id
// (ErrNotTheCopy), the job is delivered again after delay instead: it is
// never dropped. An error wrapping ErrAckUnconfirmed means the dead
// letter is stored and only the original's ack was not confirmed.
func (m *Msg) Dead(ctx context.Context, info DeadInfo, delay time.Duration) error {
	defer m.c.settle(m)
	job := m.job
	msg := nats.NewMsg(DeadSubject(job.Lane))
	msg.Data = job.Payload
	h := msg.Header
	h.Set(HeaderJobID, job.ID)
	h.Set(HeaderLane, job.Lane)
	if job.Key != "" {
		h.Set(HeaderKey, job.Key)
	}
	if job.ContentType != "" {
		h.Set(HeaderContentType, job.ContentType)
	}
	h.Set(HeaderAttempts, strconv.Itoa(job.Attempts+1))
	h.Set(HeaderDeadReason, info.Reason)
	if info.LastStatus != 0 {
		h.Set(HeaderLastStatus, strconv.Itoa(info.LastStatus))
	}
	if info.LastError != "" {
		h.Set(HeaderLastError, info.LastError)
	}
	h.Set(HeaderDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
	setTrace(h, job.Trace)
	setDest(h, job.Dest)
	// Where its settled record goes, and when it may no longer start:
	// a replay keeps them (ReplayDead).
	if job.Callback != "" {
		h.Set(HeaderCallback, job.Callback)
	}
	if job.Reply != "" {
		h.Set(HeaderReplyStored, job.Reply)
	}
	if !job.Expires.IsZero() {
		h.Set(headerExpiresAt, strconv.FormatInt(job.Expires.UnixMilli(), 10))
	}
	// Whose job it is: a replay whose record is gone gives the new one
	// its owner.
	if job.Owner != "" && !job.Outside {
		h.Set(HeaderOwner, job.Owner)
	}
	// De-duplicate a repeat after a crash between store and ack.
	h.Set(jetstream.MsgIDHeader, m.deadMsgID())
	st, err := m.c.q.deadStream()
	if err == nil {
		err = m.c.q.storeCopy(ctx, st, msg)
	}
	if err != nil {
		_ = m.m.NakWithDelay(delay)
		return fmt.Errorf("queue: dead-letter %s: %w", job.ID, err)
	}
	m.c.leftLane(m)
	// A confirmed ack, on this path that already waited for a store:
	// a plain one lost at a stop would leave the original to be
	// delivered again beside its copy.
	return confirmAck(ctx, m.m)
}

func deadFromRaw(raw *jetstream.RawStreamMsg) api.DeadLetter {
	h := raw.Header
	d := api.DeadLetter{
		Seq: raw.Sequence, ID: h.Get(HeaderJobID), Lane: h.Get(HeaderLane), Key: h.Get(HeaderKey),
		Reason: h.Get(HeaderDeadReason), LastError: h.Get(HeaderLastError),
		ContentType: h.Get(HeaderContentType), Size: len(raw.Data), Payload: raw.Data,
	}
	d.Attempts, _ = strconv.Atoi(h.Get(HeaderAttempts))
	d.LastStatus, _ = strconv.Atoi(h.Get(HeaderLastStatus))
	d.DeadAt, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderDeadAt))
	if ms, err := strconv.ParseInt(h.Get(headerExpiresAt), 10, 64); err == nil && ms > 0 {
		at := time.UnixMilli(ms).UTC()
		d.Expires = &at
	}
	if jd := decodeDest(h); !jd.IsZero() {
		// Method, path, URL and the names of the forwarded headers; the
		// values stay in the stream for a replay and are never shown.
		d.Method, d.Path, d.URL, d.Headers = jd.Method, jd.Path, jd.URL, jd.HeaderNames()
	}
	return d
}

func (q *Queue) deadStream() (jetstream.Stream, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead == nil {
		return nil, errors.New("queue: dead-letter stream not set up")
	}
	return q.dead, nil
}

// GetDead returns one dead letter of lane with its payload.
func (q *Queue) GetDead(ctx context.Context, lane string, seq uint64) (api.DeadLetter, error) {
	d, _, err := q.getDead(ctx, lane, seq)
	return d, err
}

// jobShape is what a replay keeps of a dead job besides its listing: its
// trace context, where it goes (forwarded values included), where its
// settled record goes (its callback and reply subject, checked again
// against the lane's lists when the record is sent), its expiry and its
// owner.
type jobShape struct {
	trace    tracectx.Context
	dest     dest.Request
	callback string
	reply    string
	expires  time.Time
	owner    string
}

// shapeOf reads a dead letter's shape; its headers were written by the
// throttler (Dead), and are bounded as a stored job's are.
func shapeOf(h nats.Header) jobShape {
	tc, _ := decodeTrace(h) // stored by the throttler: checked already
	sh := jobShape{trace: tc, dest: decodeDest(h), reply: replyOf(h.Values(HeaderReplyStored))}
	if cb := h.Get(HeaderCallback); len(cb) <= dest.MaxURL {
		sh.callback = cb
	}
	if o := h.Get(HeaderOwner); ValidJobID(o) == nil {
		sh.owner = o
	}
	if ms, err := strconv.ParseInt(h.Get(headerExpiresAt), 10, 64); err == nil && ms > 0 {
		sh.expires = time.UnixMilli(ms)
	}
	return sh
}

// getDead is GetDead with the dead job's shape.
func (q *Queue) getDead(ctx context.Context, lane string, seq uint64) (api.DeadLetter, jobShape, error) {
	if _, err := q.deadStream(); err != nil {
		return api.DeadLetter{}, jobShape{}, err
	}
	raw, err := q.leaderGet(ctx, DeadStream, seq, "")
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && raw.Subject != DeadSubject(lane)) {
		return api.DeadLetter{}, jobShape{}, fmt.Errorf("%w: %s #%d", ErrNotFound, lane, seq)
	}
	if err != nil {
		return api.DeadLetter{}, jobShape{}, fmt.Errorf("%w: dead letter %s #%d: %v", ErrUnavailable, lane, seq, err)
	}
	return deadFromRaw(raw), shapeOf(raw.Header), nil
}

// ErrReplayExpired: the dead letter's job named an expiry
// (Throttle-Expires) that has passed; it is not replayed, and stays.
var ErrReplayExpired = errors.New("queue: the job's expiry has passed; it is not replayed")

// ReplayHook hears a dead letter replayed (records.Hook): before the job
// is stored again, Replaying puts its record back to queued (when its
// lane keeps records); when the store then fails, undo (never nil when
// err is nil) puts the record back as it was.
type ReplayHook interface {
	Replaying(ctx context.Context, r records.Replay) (undo func(), err error)
}

// SetReplayHook makes h hear the replays of dead letters; nil hears none.
// Set it before the queue is used.
func (q *Queue) SetReplayHook(h ReplayHook) {
	q.mu.Lock()
	q.replays = h
	q.mu.Unlock()
}

// ErrReplayUndeliverable: the dead letter's job could never be delivered
// on its lane as it is: it has no key and the lane is keyed, or a key the
// lane's key rules refuse (poison.go). It is not replayed, and stays; a
// replay that gives it a key the lane takes (ReplayOptions.Key) is.
var ErrReplayUndeliverable = errors.New("queue: the job cannot be delivered on its lane as it is; it is not replayed")

// UndeliverableError is ErrReplayUndeliverable for one dead letter: which
// one, and why.
type UndeliverableError struct {
	Lane string
	Seq  uint64
	ID   string
	// Reason says what the lane refuses, e.g. "the job has no
	// Throttle-Key; lane webhooks is keyed".
	Reason string
	// Given: the key was the replay's (ReplayOptions.Key), not the dead
	// letter's.
	Given bool
}

func (e *UndeliverableError) Error() string {
	return fmt.Sprintf("queue: dead letter %s #%d (job %s) cannot be delivered on its lane: %s", e.Lane, e.Seq, e.ID, e.Reason)
}

// Is makes an UndeliverableError ErrReplayUndeliverable.
func (e *UndeliverableError) Is(target error) bool { return target == ErrReplayUndeliverable }

// ReplayOptions change the job a replay stores.
type ReplayOptions struct {
	// Key, when set, replaces the job's key: the key of a job
	// dead-lettered without one (published on throttle.<lane> of a keyed
	// lane) or with one the lane refuses. It is checked as a public job's
	// key is (ValidKey, and on a url_host lane against the job's URL).
	Key string
}

// ReplayDead puts one dead letter back into its lane, behind the current
// backlog, with its attempts reset, then deletes the dead letter. The job
// keeps its id, trace context, destination, callback, reply subject,
// expiry and owner, and its key unless opt gives one, and carries seq
// (Job.ReplayedFrom), which names its settled record's callback
// (CallbackID); a job whose expiry has passed is not replayed
// (ErrReplayExpired), nor one that could never be delivered on its lane
// (an *UndeliverableError: no key on a keyed lane, or a key the lane
// refuses). Its not-before time is not kept: it started once. The returned
// dead letter has the key the job was stored with.
func (q *Queue) ReplayDead(ctx context.Context, lane string, seq uint64, opt ReplayOptions) (api.DeadLetter, error) {
	d, shape, err := q.getDead(ctx, lane, seq)
	if err != nil {
		return d, err
	}
	if !shape.expires.IsZero() && !time.Now().Before(shape.expires) {
		return d, fmt.Errorf("%w: %s #%d (job %s) expired at %s", ErrReplayExpired, lane, seq, d.ID, shape.expires.UTC().Format(time.RFC3339Nano))
	}
	ls, err := q.lane(lane)
	if err != nil {
		return d, err
	}
	q.mu.Lock()
	epoch, hook := q.deadEpoch, q.replays
	q.mu.Unlock()
	job := Job{
		ID: d.ID, Lane: lane, Key: d.Key, ContentType: d.ContentType, Payload: d.Payload, Trace: shape.trace, Dest: shape.dest,
		Callback: shape.callback, Reply: shape.reply, Expires: shape.expires, Owner: shape.owner, ReplayedFrom: seq,
		MsgID: fmt.Sprintf("replay %s %d", origin(DeadStream, epoch), seq),
	}
	if opt.Key != "" {
		job.Key = opt.Key
	}
	// Checked before anything is written: the record, the lane, the
	// dead letter stay as they are.
	if reason := replayKeyReason(ls.spec, &job, ls.keyed); reason != "" {
		return d, &UndeliverableError{Lane: lane, Seq: seq, ID: d.ID, Reason: reason, Given: opt.Key != ""}
	}
	d.Key = job.Key
	undo := func() {}
	if hook != nil {
		if undo, err = hook.Replaying(ctx, records.Replay{Lane: lane, ID: d.ID, Key: job.Key, Callback: shape.callback, Owner: shape.owner, Seq: seq}); err != nil {
			return d, fmt.Errorf("%w: the record of %s: %w", ErrUnavailable, d.ID, err)
		}
	}
	if err := q.republish(ctx, job); err != nil {
		undo()
		return d, err
	}
	return d, q.DeleteDead(ctx, lane, seq)
}

// maxUndeliverableSeqs bounds the sequence numbers Replayed lists.
const maxUndeliverableSeqs = 100

// Replayed counts what ReplayAllDead did.
type Replayed struct {
	// Replayed dead letters, at most the call's max.
	Replayed int
	// Expired dead letters passed over (ErrReplayExpired): they stay,
	// and do not count against max.
	Expired int
	// Undeliverable dead letters passed over (ErrReplayUndeliverable):
	// they stay, and do not count against max; UndeliverableSeqs are
	// the first maxUndeliverableSeqs of them, for a replay of each with
	// its key.
	Undeliverable     int
	UndeliverableSeqs []uint64
	// Until is the last dead-letter sequence the call could replay: the
	// dead-letter stream's last when it began, or the call's until when
	// lower. A replay of all in several calls passes the first call's
	// Until to the others, so that a job replayed by one and dead again
	// before the next is not replayed twice.
	Until uint64
}

// ReplayAllDead replays every dead letter of lane, oldest first, up to max,
// passing over those whose expiry has passed and those that could never
// be delivered on the lane as they are (ReplayDead). Only the dead letters
// stored when it began are replayed: a replayed job that dies again during
// the call (its target still refuses it) is stored behind them and stays
// dead, instead of being replayed over and over up to max. until, when not
// 0, bounds the sequences replayed further (Replayed.Until).
func (q *Queue) ReplayAllDead(ctx context.Context, lane string, max int, until uint64) (Replayed, error) {
	var out Replayed
	st, err := q.deadStream()
	if err != nil {
		return out, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return out, fmt.Errorf("%w: dead letters of %s: %v", ErrUnavailable, lane, err)
	}
	last := info.State.LastSeq
	if until > 0 {
		last = min(last, until)
	}
	out.Until = last
	var after uint64
	for out.Replayed < max {
		page, err := q.ListDead(ctx, lane, after, min(256, max-out.Replayed))
		if err != nil {
			return out, err
		}
		if len(page) == 0 {
			return out, nil
		}
		for _, d := range page {
			if d.Seq > last {
				return out, nil
			}
			after = d.Seq
			_, err := q.ReplayDead(ctx, lane, d.Seq, ReplayOptions{})
			switch {
			case errors.Is(err, ErrReplayExpired):
				out.Expired++
				continue
			case errors.Is(err, ErrReplayUndeliverable):
				out.Undeliverable++
				if len(out.UndeliverableSeqs) < maxUndeliverableSeqs {
					out.UndeliverableSeqs = append(out.UndeliverableSeqs, d.Seq)
				}
				continue
			case err != nil:
				return out, err
			}
			out.Replayed++
		}
	}
	return out, nil
}

// DeleteDead removes one dead letter.
func (q *Queue) DeleteDead(ctx context.Context, lane string, seq uint64) error {
	st, err := q.deadStream()
	if err != nil {
		return err
	}
	if _, err := q.GetDead(ctx, lane, seq); err != nil {
		return err
	}
	if err := st.DeleteMsg(ctx, seq); err != nil {
		return fmt.Errorf("%w: delete dead letter %s #%d: %v", ErrUnavailable, lane, seq, err)
	}
	return nil
}

// PurgeDead removes every dead letter of lane.
func (q *Queue) PurgeDead(ctx context.Context, lane string) error {
	st, err := q.deadStream()
	if err != nil {
		return err
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(DeadSubject(lane))); err != nil {
		return fmt.Errorf("%w: purge dead letters of %s: %v", ErrUnavailable, lane, err)
	}
	return nil
}

// CountDead is how many dead letters lane holds.
func (q *Queue) CountDead(ctx context.Context, lane string) (uint64, error) {
	st, err := q.deadStream()
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(DeadSubject(lane)))
	if err != nil {
		return 0, fmt.Errorf("%w: dead-letter stream: %v", ErrUnavailable, err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}
