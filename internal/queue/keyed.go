package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
// Jobs published on the public subjects, throttle.<lane> and
// throttle.<lane>.<key>, are stored in a stream of their own, the lane's
// intake stream THROTTLE-INTAKE_<lane> (intakein.go), and moved into the
// lane stream, onto their key's internal subject, as the lane stream has
// room. That keeps the trust boundary of intake.go, gives every job of a key
// one subject to read in order, and keeps a burst of public jobs from
// filling the lane stream with jobs nobody can move (the lane stream holds
// only jobs ready to be read by key).

// IntakeConsumerName was the durable consumer of a keyed lane's public
// subjects on its lane stream; a lane stream that still has it is migrated
// (EnsureKeyedLane).
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
// stream. A lane whose stream is a work queue (it was not keyed before) is
// refused: JetStream cannot change a stream's retention.
//
// A lane stream of the former layout, which also took the public subjects,
// is migrated: its intake consumer is deleted, the public subjects move to
// the intake stream, and the jobs it still holds on them are moved onto
// their keys by RunIntake before any job of the intake stream. Until then
// the lane stream's MaxMsgs is max_backlog plus those jobs, so that moving
// them never waits for room they take themselves.
func (q *Queue) EnsureKeyedLane(ctx context.Context, spec LaneSpec) error {
	if spec.Replicas == 0 {
		spec.Replicas = 1
	}
	name := StreamName(spec.Name)
	var left uint64 // jobs on public subjects in the lane stream (former layout)
	if st, err := q.js.Stream(ctx, name); err == nil {
		cfg := st.CachedInfo().Config
		if cfg.Retention == jetstream.WorkQueuePolicy {
			return fmt.Errorf("queue: lane %s is keyed (per_key) but its stream %s was made for an unkeyed lane; "+
				"drain it and delete the stream (nats stream rm %s) before making the lane keyed", spec.Name, name, name)
		}
		if slices.Contains(cfg.Subjects, Subject(spec.Name, ">")) {
			// The former intake consumer filters on subjects the
			// stream is about to give up.
			if err := st.DeleteConsumer(ctx, IntakeConsumerName); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("queue: migrate keyed lane %s: delete its intake consumer: %w", spec.Name, err)
			}
		}
		if left, err = publicLeft(ctx, st, spec.Name); err != nil {
			return fmt.Errorf("queue: migrate keyed lane %s: %w", spec.Name, err)
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("queue: stream for keyed lane %s: %w", spec.Name, err)
	}
	st, err := ensureStream(ctx, q.js, laneStreamConfig(spec, left))
	if err != nil {
		return fmt.Errorf("queue: stream for keyed lane %s: %w", spec.Name, err)
	}
	in, err := ensureStream(ctx, q.js, jetstream.StreamConfig{
		Name:        IntakeStreamName(spec.Name),
		Description: "throttler intake of keyed lane " + spec.Name + ": jobs published on its public subjects",
		Subjects:    []string{Subject(spec.Name, ""), Subject(spec.Name, ">")},
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
		return fmt.Errorf("queue: intake stream for keyed lane %s: %w", spec.Name, err)
	}
	retry, err := q.ensureRetryConsumer(ctx, spec)
	if err != nil {
		return err
	}
	var tries jetstream.KeyValue
	former := false
	if spec.Ordered {
		if tries, err = q.ensureTries(ctx, spec.Replicas); err != nil {
			return err
		}
		if former, err = q.formerTries(ctx, spec.Name); err != nil {
			return err
		}
	}
	q.mu.Lock()
	q.lanes[spec.Name] = &laneState{spec: spec, stream: st, epoch: st.CachedInfo().Created.UnixNano(), retry: retry, keyed: true, tries: tries,
		formerTries: former, in: in, inEpoch: in.CachedInfo().Created.UnixNano(), migrate: left > 0}
	q.mu.Unlock()
	return nil
}

// laneStreamConfig is a keyed lane's stream: its keys' internal subjects
// only, with room for left more jobs than max_backlog while jobs of the
// former layout are moved.
func laneStreamConfig(spec LaneSpec, left uint64) jetstream.StreamConfig {
	maxMsgs := spec.MaxBacklog
	if maxMsgs > 0 {
		maxMsgs += int64(left)
	}
	return jetstream.StreamConfig{
		Name:        StreamName(spec.Name),
		Description: "throttler keyed lane " + spec.Name,
		Subjects:    []string{InternalSubject(spec.Name, ""), InternalSubject(spec.Name, ">")},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     maxMsgs,
		MaxBytes:    maxBytes(spec.MaxBytes),
		Discard:     jetstream.DiscardNew,
		MaxMsgSize:  int32(spec.MaxBody + HeaderRoom),
		Duplicates:  spec.DedupWindow,
		Replicas:    spec.Replicas,
		AllowDirect: true,
	}
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
	// Holds, when set, reports whether this instance has held key (its
	// claim) since before the time given: when the lane is read ahead
	// (keyedahead.go), only the messages of keys held since before the
	// request was sent are kept. Nil holds every key (one reader).
	Holds func(key string, since time.Time) bool

	// ahead is what was read ahead across keys; inbox the subscription
	// its requests share; scanBatch the messages asked per request.
	ahead     *ahead
	inbox     replies
	scanBatch int

	// Settled jobs' deletes under way (Ack does not wait for them): by
	// sequence, and their number per key. A read passes over them and
	// Keys leaves out a key that has no other job, so a settled job is
	// never read again while its delete is on its way.
	mu        sync.Mutex
	deleting  map[uint64]struct{}
	deletingK map[string]int
	// gone are the deletes answered in the last getTimeout, oldest
	// first: a read sent before the answer may still bring one back.
	gone    []goneMsg
	goneSet map[uint64]struct{}
	idle    *sync.Cond // signalled as deletes end
	deletes sync.WaitGroup
	// toDelete are settled jobs whose deletes wait to be sent; sending
	// says sendDeletes runs.
	toDelete []settledMsg
	sending  bool
}

// goneMsg is a settled job's message deleted at at.
type goneMsg struct {
	seq uint64
	at  time.Time
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
	r := &KeyedReader{q: q, ls: ls, c: &Consumer{q: q, lane: lane, origin: origin(StreamName(lane), ls.epoch), outstanding: map[*Msg]time.Time{}},
		deleting: map[uint64]struct{}{}, deletingK: map[string]int{}, goneSet: map[uint64]struct{}{},
		ahead: newAhead(), scanBatch: scanBatch}
	r.idle = sync.NewCond(&r.mu)
	return r, nil
}

// getTimeout bounds one direct get.
const getTimeout = 2 * time.Second

// Next returns key's first stored job at or after the stream sequence from
// (1 for the oldest), or nil when there is none: out of what was read ahead
// across keys when that covers from (keyedahead.go), else by a direct get
// of the key's subject.
//
// A settled job whose delete is still on its way is passed over.
func (r *KeyedReader) Next(ctx context.Context, key string, from uint64) (*Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	from = max(from, 1)
	// At most one scan per read: a key whose next job lies further on in
	// the stream than one scan reaches (a fresh key behind a long backlog)
	// is read alone at once rather than after scans of other keys' jobs.
	m, next, scan := r.ahead.find(key, from, time.Now(), r.isDeleting)
	if m != nil {
		return r.msg(key, m.seq, m.hdr, m.data, m.at), nil
	}
	from = next
	if scan {
		covered, none, err := r.scan(ctx, from)
		switch {
		case err != nil:
			r.q.log.Debug("reading a keyed lane ahead failed; reading the key alone", "lane", r.ls.spec.Name, "err", err)
		case none:
			return nil, nil
		case covered:
			if m, next, _ = r.ahead.find(key, from, time.Now(), r.isDeleting); m != nil {
				return r.msg(key, m.seq, m.hdr, m.data, m.at), nil
			}
			from = next
		}
	}
	var raw *jetstream.RawStreamMsg
	for ; ; from = raw.Sequence + 1 {
		var err error
		raw, err = r.ls.stream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(InternalSubject(r.ls.spec.Name, key)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: read key %s of lane %s: %v", ErrUnavailable, key, r.ls.spec.Name, err)
		}
		if !r.isDeleting(raw.Sequence) {
			break
		}
	}
	return r.msg(key, raw.Sequence, raw.Header, raw.Data, raw.Time), nil
}

// msg is the job of key's message seq, stored at at.
func (r *KeyedReader) msg(key string, seq uint64, hdr nats.Header, data []byte, at time.Time) *Msg {
	job := decodeJob(r.ls.spec.Name, hdr, data, key, seq, true, time.Now())
	job.Attempts = max(job.Attempts, r.c.attemptsInPlace(seq, 0))
	if job.EnqueuedAt.IsZero() {
		job.EnqueuedAt = at
	}
	meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumDelivered: 1, Timestamp: at, Stream: r.ls.stream.CachedInfo().Config.Name}
	return &Msg{job: job, m: &keyedAck{r: r, key: key, seq: seq}, meta: meta, c: r.c, origin: r.c.origin, maxAge: r.ls.spec.MaxAge}
}

// Release hands msgs back unstarted: each is again its key's next job.
func (r *KeyedReader) Release(msgs []*Msg) {
	for _, m := range msgs {
		_ = m.Release()
	}
}

// Keys lists the keys with stored jobs (on the internal subjects), for a
// sweep at start and after a lost owner. It reads JetStream's per-subject
// counts (paged by the client). Jobs it finds stranded on subjects no key
// reads (a keyless one, or one with a key ValidKey refuses) are
// dead-lettered on the way (deadStranded).
func (r *KeyedReader) Keys(ctx context.Context) ([]string, error) {
	lane := r.ls.spec.Name
	info, err := r.ls.stream.Info(ctx, jetstream.WithSubjectFilter(InternalSubject(lane, ">")))
	if err != nil {
		return nil, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, lane, err)
	}
	prefix := InternalSubject(lane, "") + "."
	keys := make([]string, 0, len(info.State.Subjects))
	var stranded []string
	var listed uint64
	r.mu.Lock()
	for subj, n := range info.State.Subjects {
		listed += n
		k, ok := strings.CutPrefix(subj, prefix)
		switch {
		case !ok || ValidKey(k) != nil:
			stranded = append(stranded, subj)
		case n > uint64(r.deletingK[k]):
			keys = append(keys, k)
		}
	}
	r.mu.Unlock()
	if info.State.Msgs > listed {
		// Messages on no key's subject: on the lane's own (keyless)
		// subject, or public jobs of the former layout not moved yet
		// (those the read below does not find).
		stranded = append(stranded, InternalSubject(lane, ""))
	}
	if len(stranded) > 0 {
		r.q.deadStranded(ctx, r.ls, stranded)
	}
	return keys, nil
}

// isDeleting reports whether seq is a settled job's message being deleted,
// or deleted recently enough that a read sent before could still see it.
func (r *KeyedReader) isDeleting(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.deleting[seq]; ok {
		return true
	}
	_, ok := r.goneSet[seq]
	return ok
}

// forgetGone drops the deletes answered more than a read's timeout ago
// (no read sent before them is still under way). r.mu is held.
func (r *KeyedReader) forgetGone(now time.Time) {
	i := 0
	for ; i < len(r.gone) && now.Sub(r.gone[i].at) > getTimeout; i++ {
		delete(r.goneSet, r.gone[i].seq)
	}
	r.gone = r.gone[i:]
}

// testHookDelete, set by tests only, runs before a settled job's delete
// is sent (it may hold it).
var testHookDelete func(seq uint64)

// deleteTimeout bounds a settled job's delete.
const deleteTimeout = 5 * time.Second

// deleteAsync deletes a settled job's message off the dispatch: its
// dispatch (and its in-flight permit) ends without waiting for the round
// trip. The deletes settled meanwhile go out together (sendDeletes). Until
// the delete has ended the job is never read again here (Next, Keys);
// Settling waits for a key's deletes, WaitDeletes for all. A delete that
// fails leaves the job stored: it is delivered again (at least once), as
// after a crash before the delete.
func (r *KeyedReader) deleteAsync(key string, seq uint64) {
	r.markDeleting(key, seq)
	r.mu.Lock()
	r.toDelete = append(r.toDelete, settledMsg{key: key, seq: seq})
	start := !r.sending
	r.sending = true
	r.mu.Unlock()
	if start {
		r.deletes.Go(r.sendDeletes)
	}
}

// settledMsg is a settled job's message to delete.
type settledMsg struct {
	key string
	seq uint64
}

// deleteBatch bounds the deletes sent together.
const deleteBatch = 256

// sendDeletes sends the deletes waiting, up to deleteBatch at a time, one
// request each without waiting between them, and gathers their answers;
// it returns when none waits. One runs at a time (r.sending).
func (r *KeyedReader) sendDeletes() {
	for {
		r.mu.Lock()
		n := min(len(r.toDelete), deleteBatch)
		if n == 0 {
			r.toDelete, r.sending = nil, false
			r.mu.Unlock()
			return
		}
		batch := slices.Clone(r.toDelete[:n])
		r.toDelete = r.toDelete[n:]
		r.mu.Unlock()
		errs := r.deleteMany(batch)
		for i, d := range batch {
			if errs[i] != nil {
				r.q.log.Warn("deleting a settled keyed job failed; it may be delivered again", "lane", r.ls.spec.Name, "key", d.key, "seq", d.seq, "err", errs[i])
			}
		}
		r.deleted(batch, errs)
	}
}

// markDeleting marks key's message seq as being deleted: it leaves what was
// read ahead, and no read answers it until its delete ended (deleted).
func (r *KeyedReader) markDeleting(key string, seq uint64) {
	r.ahead.drop(key, seq)
	r.mu.Lock()
	r.deleting[seq] = struct{}{}
	r.deletingK[key]++
	r.mu.Unlock()
}

// deleted ends the deletes of batch (errs[i] is the i-th's outcome): one
// that succeeded stays passed over for a read's timeout (gone), in case a
// read sent before it brings it back.
func (r *KeyedReader) deleted(batch []settledMsg, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.forgetGone(now)
	for i, d := range batch {
		delete(r.deleting, d.seq)
		if errs[i] == nil {
			r.gone = append(r.gone, goneMsg{seq: d.seq, at: now})
			r.goneSet[d.seq] = struct{}{}
		}
		if r.deletingK[d.key]--; r.deletingK[d.key] <= 0 {
			delete(r.deletingK, d.key)
		}
	}
	r.idle.Broadcast()
}

// deleteMany deletes batch's messages: every request is sent, then the
// answers are gathered, within deleteTimeout for all. A message gone
// already counts as deleted, as in deleteMsg.
func (r *KeyedReader) deleteMany(batch []settledMsg) []error {
	errs := make([]error, len(batch))
	calls := make([]*call, len(batch))
	subj := "$JS.API.STREAM.MSG.DELETE." + r.ls.stream.CachedInfo().Config.Name
	for i, d := range batch {
		if testHookDelete != nil {
			testHookDelete(d.seq)
		}
		c, reply, err := r.inbox.open(r.q.nc, 1)
		if err != nil {
			errs[i] = err
			continue
		}
		body := strconv.AppendUint([]byte(`{"seq":`), d.seq, 10)
		body = append(body, `,"no_erase":true}`...)
		if err := r.q.nc.PublishRequest(subj, reply, body); err != nil {
			r.inbox.close(c)
			errs[i] = err
			continue
		}
		calls[i] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	for i, c := range calls {
		if c == nil {
			continue
		}
		select {
		case <-c.done:
			errs[i] = deleteAnswer(c.msgs)
		case <-ctx.Done():
			r.inbox.close(c)
			errs[i] = ctx.Err()
		}
	}
	return errs
}

// deleteAnswer reads a delete's answer: nil when it deleted the message
// or said it could not (gone already: settled twice, by a former owner of
// the key), as deleteMsg; an error when it is no JetStream answer (no
// responders, a status) or none came.
func deleteAnswer(msgs []*nats.Msg) error {
	if len(msgs) != 1 {
		return errors.New("no answer")
	}
	m := msgs[0]
	if st := statusOf(m); st != "" {
		return fmt.Errorf("status %s %s", st, m.Header.Get("Description"))
	}
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Code    int `json:"code"`
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("delete answer: %w", err)
	}
	if !resp.Success && resp.Error == nil {
		return errors.New("delete answer: neither success nor an error")
	}
	return nil
}

// deleteMsg deletes the message at seq; one gone already counts as
// deleted (settled twice: a former owner of the key).
func (r *KeyedReader) deleteMsg(ctx context.Context, seq uint64) error {
	err := r.ls.stream.DeleteMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		err = nil
	}
	return err
}

// Settling waits until key's settled jobs' deletes have ended (or ctx):
// before its claim is given up, so that no instance that takes the key
// over reads one of them again.
//
// What was read ahead of key is forgotten: once given up, the key's jobs
// may be settled by another instance.
func (r *KeyedReader) Settling(ctx context.Context, key string) error {
	r.ahead.forget(key)
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.idle.Broadcast()
		r.mu.Unlock()
	})
	defer stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.deletingK[key] > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.idle.Wait()
	}
	return nil
}

// WaitDeletes waits for every delete under way: the lane stops, and the
// connection closes after.
func (r *KeyedReader) WaitDeletes() { r.deletes.Wait() }

// Close ends the subscription the reads ahead share (the lane stopped);
// a later read makes it again.
func (r *KeyedReader) Close() { r.inbox.stop() }

// keyedAck settles a message read by subject: done deletes it; handed back
// it stays, the oldest of its key again.
type keyedAck struct {
	r   *KeyedReader
	key string
	seq uint64
}

// Ack deletes the message without waiting for the answer (deleteAsync).
func (a *keyedAck) Ack() error {
	a.r.deleteAsync(a.key, a.seq)
	return nil
}

// DoubleAck deletes the message and waits for the server's answer (a
// stopping instance).
//
// As Ack's, the message is not answered by a read meanwhile, nor by what
// was read ahead of it (a job retried or dead-lettered must not start
// again from its original).
func (a *keyedAck) DoubleAck(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	a.r.markDeleting(a.key, a.seq)
	err := a.r.deleteMsg(ctx, a.seq)
	a.r.deleted([]settledMsg{{key: a.key, seq: a.seq}}, []error{err})
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

// HeaderVia says, on a keyed lane's internal copy of a job published on its
// public subject, that the job came in over NATS ("nats"): the lane counts
// it as NATS intake when it first starts.
const HeaderVia = "Throttler-Via"
