// Package queue keeps every job durably on NATS JetStream between intake and
// dispatch. It is the JetStream adapter of the throttler: ingest publishes
// through it, and a lane's drain reads through its Consumer. It knows nothing
// of pacing.
//
// Layout: one stream per lane, THROTTLE_<lane>, file storage, work-queue
// retention (a job leaves the stream when it is acked), subjects
// throttle.<lane> and throttle.<lane>.<key>, MaxMsgs = the lane's max_backlog
// with DiscardNew, so a full lane refuses a publish instead of dropping an
// older job, and the backlog bound holds exactly whatever instance publishes.
// One durable pull consumer per lane, "drain", shared by every instance. The
// job id travels as Nats-Msg-Id, so JetStream de-duplicates resubmissions
// within the dedup window. Streams and consumers are created or updated at
// start, so an upgrade needs no manual step.
package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"golang.org/x/sync/singleflight"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/tracectx"
)

// Subject prefix and header names, part of the contract with publishers.
const (
	SubjectPrefix = "throttle"
	// HeaderNotify names where the instance that took a job over HTTP waits
	// to hear the slot the drain gives it (NotifySubject): it answers
	// "admitted" only for a slot due at once. Set only by the throttler.
	HeaderNotify = "Throttler-Notify"
	// HeaderContentType carries the payload's media type.
	HeaderContentType = "Content-Type"
	// HeaderJobID carries the job id through retries and replays, whose
	// copies need Nats-Msg-Id values of their own.
	HeaderJobID = "Throttler-Job-Id"
	// HeaderAttempts counts the delivery attempts that failed before this
	// copy of the job was stored. Rate-limit waits do not count.
	HeaderAttempts = "Throttler-Attempts"
	// HeaderNotBefore holds the earliest start of a retry, in Unix ms.
	HeaderNotBefore = "Throttler-Not-Before"
	// HeaderEnqueuedAt holds when a retry's job was first stored, in Unix
	// ms: its end-to-end time counts from there.
	HeaderEnqueuedAt = "Throttler-Enqueued-At"
	// HeaderWait names where a caller waits for the job's settled record
	// (records.WaitSubject). Set only by the throttler.
	HeaderWait = "Throttler-Wait"
	// HeaderCallback is the URL the job's settled record is POSTed to
	// (Throttle-Callback at intake, checked there against the lane's
	// results.callback_urls). Read only on the throttler's own subject.
	HeaderCallback = "Throttler-Callback"
	// HeaderReplyStored is the NATS subject the job's settled record is
	// published to: Throttle-Reply on the public subject
	// (records.HeaderReply), carried on the throttler's own subject as
	// this header. The store checks it against the lane's
	// results.reply_subjects before each publish.
	HeaderReplyStored = "Throttler-Reply"
	// HeaderRecordRev is the revision of the job's record when intake
	// stored the job: the drain's claim tries it first. Set only by the
	// throttler.
	HeaderRecordRev = "Throttler-Record-Rev"
	// HeaderIDPrefix makes a job's id its prefix and its stream sequence
	// (SeqID), for a job stored without an id of its own: such a job is
	// found by its id in its lane's stream (Lookup) without a record.
	// Set only by the throttler.
	HeaderIDPrefix = "Throttler-Id-Prefix"
	// HeaderNotifyID is the name the instance that took the job waits for
	// its slot under (Hub.Expect), when the id is not known before the job
	// is stored (HeaderIDPrefix). Set only by the throttler.
	HeaderNotifyID = "Throttler-Notify-Id"
	// HeaderOwner is the id of the API key that submitted the job over
	// HTTP (api.JobRecord.Owner). Set only by the throttler, and read only
	// on its own subject from a job it took over HTTP (never from one
	// published over NATS, moved or not): an outside publisher cannot
	// make a job someone's.
	HeaderOwner = "Throttler-Owner"
	// HeaderReplayedFrom is the sequence of the dead letter a replayed
	// job came from (ReplayDead): its claim keeps it in a record it makes
	// again, where it names the replay's callback (CallbackID). Set only
	// by the throttler, and read only on its own subject.
	HeaderReplayedFrom = "Throttler-Replayed-From"
	// ConsumerName is the durable pull consumer every instance shares.
	ConsumerName = "drain"
)

// Errors a publisher can meet; each wraps the underlying NATS error.
var (
	// ErrBacklogFull: the lane's stream holds max_backlog jobs. It is
	// api.ErrBacklogFull, which the admission decision's refusal matches
	// too.
	ErrBacklogFull = api.ErrBacklogFull
	// ErrUnavailable: JetStream did not confirm the write; the job may not
	// be stored and the caller must not report success.
	ErrUnavailable = errors.New("queue: JetStream unavailable")
	// ErrFull: the lane's stream reached its max_bytes, or JetStream's
	// storage is full; nothing was stored.
	ErrFull = errors.New("queue: storage full")
	// ErrUnknownLane: no stream was set up for the lane.
	ErrUnknownLane = errors.New("queue: unknown lane")
	// ErrAckUnconfirmed: a retry's or dead letter's copy is stored, but the
	// server did not confirm the original's ack in time: the job is
	// settled, and may be delivered once more if the ack was lost.
	ErrAckUnconfirmed = errors.New("queue: copy stored, ack of the original unconfirmed")
)

// ackConfirmTimeout bounds the wait for a confirmed ack: a server that
// closed the consumer sends no answer at all.
const ackConfirmTimeout = time.Second

// confirmAck acks m's original and waits up to ackConfirmTimeout for the
// server to apply it; a failure wraps ErrAckUnconfirmed.
func confirmAck(ctx context.Context, m acker) error {
	ctx, cancel := context.WithTimeout(ctx, ackConfirmTimeout)
	defer cancel()
	if err := m.DoubleAck(ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrAckUnconfirmed, err)
	}
	return nil
}

// HeaderRoom is the room a stored job needs for its headers beyond the
// payload: ids of at most 255 bytes, a Content-Type of at most 1 KiB, the
// trace context (a traceparent, a tracestate of at most 512 bytes and a
// baggage of at most 8 KiB: trace.go) and the throttler's own headers.
const HeaderRoom = 16 << 10

// Subject returns the subject of a lane, or of one key of it.
func Subject(lane, key string) string {
	if key == "" {
		return SubjectPrefix + "." + lane
	}
	return SubjectPrefix + "." + lane + "." + key
}

// StreamName returns the stream that holds a lane's jobs.
func StreamName(lane string) string { return "THROTTLE_" + lane }

// LaneSpec is what the queue needs to know of a lane.
type LaneSpec struct {
	Name        string
	MaxBacklog  int64
	MaxInflight int
	// Prefetch is how many jobs one instance fetches ahead.
	Prefetch int
	// AckWait is how long a fetched job may stay unanswered before JetStream
	// hands it out again.
	AckWait time.Duration
	MaxBody int64
	// MaxBytes bounds the lane's stream on disk; a full stream refuses new
	// jobs (ErrFull) instead of filling the disk.
	MaxBytes    int64
	DedupWindow time.Duration
	// Replicas for a clustered JetStream; 0 means 1.
	Replicas int
	// Ordered: a keyed lane whose keys retry a failing job in place
	// (per_key.ordered); their attempts are kept in TriesBucket.
	Ordered bool
	// MaxAge dead-letters a job not started this long after it entered
	// the lane (schedule.go); 0: never.
	MaxAge time.Duration
	// MaxDelay bounds the delay a publisher may ask for on the lane's
	// public subject; 0: DefaultMaxDelay.
	MaxDelay time.Duration
	// CallbacksOnly: the lane is another lane's results.callback_lane; a
	// job published on its public subject is poison (only the throttler
	// stores jobs on it: it signs them as records the throttler settled).
	CallbacksOnly bool
	// URLKey, on a keyed lane with per_key.key_from: url_host, is the key
	// of a job's URL (dest.Rules.KeyOf): a job published on throttle.<lane>
	// with a Throttle-URL gets it as its key, and one published on a key
	// that is not its URL's host is poison (poison.go). Nil: a public job's
	// key is its subject's.
	URLKey func(url string) (string, error)
	// KeyWithoutURL, with URLKey, says whether a job published on a key
	// with no Throttle-URL may be taken (lane.Lane.KeyWithoutURL): nil,
	// else why it is poison. Nil: every such job is taken.
	KeyWithoutURL func(key string) error
}

// Job is one unit of work as stored on the queue.
type Job struct {
	ID          string
	Lane        string
	Key         string
	ContentType string
	Payload     []byte
	// Notify is where the submitting instance waits to hear the job's
	// slot (NotifySubject); empty for none.
	Notify string
	// Outside: the job was published on the lane's public subject by
	// someone else (see intake.go), not stored by the throttler.
	Outside bool
	// Attempts is how many delivery attempts already failed.
	Attempts int
	// NotBefore delays a retry, or a delayed job (schedule.go); zero for
	// none.
	NotBefore time.Time
	// Expires is when the job, if not started, is dead-lettered as
	// expired (schedule.go); zero for never.
	Expires time.Time
	// EnqueuedAt is when the job was first stored: a fetched job's own
	// store time, or for a retry its first copy's. Zero on a new job.
	EnqueuedAt time.Time
	// MsgID overrides the de-duplication id (default: ID).
	MsgID string
	// Trace is the submitter's W3C trace context (traceparent,
	// tracestate, baggage), kept through retries and replays.
	Trace tracectx.Context
	// Wait is where a caller waits for the job's settled record
	// (records.WaitSubject); empty for none.
	Wait string
	// Callback is where the job's settled record is POSTed (through the
	// lane's results.callback_lane); empty for none.
	Callback string
	// Reply is the NATS subject the job's settled record is published to
	// (Throttle-Reply on a job published over NATS), as its publisher
	// wrote it: checked against the lane's results.reply_subjects by the
	// drain before the job starts, and by the records store before each
	// publish. Empty for none.
	Reply string
	// IDPrefix, on a job stored with an empty ID, makes its id
	// SeqID(IDPrefix, seq) once stored.
	IDPrefix string
	// NotifyID names the job to the Hub when its id is not known before it
	// is stored (IDPrefix); empty: the id.
	NotifyID string
	// RecordRev is the revision of the job's record when it was stored;
	// zero for none or unknown.
	RecordRev uint64
	// Owner is the id of the API key that submitted the job over HTTP
	// (HeaderOwner); empty without API keys and for a job published over
	// NATS.
	Owner string
	// ReplayedFrom is the sequence of the dead letter the job was
	// replayed from (HeaderReplayedFrom); 0 for a job never replayed.
	ReplayedFrom uint64
	// Dest is where the job asks to go (package dest); checked at intake
	// and again by the HTTP target.
	Dest dest.Request
	// TraceErr says why the trace headers of a job published on a public
	// subject were dropped (malformed or over their bounds); nil
	// otherwise. Not stored.
	TraceErr error
	// ScheduleErr says why the schedule headers of a job published on a
	// public subject cannot be used (the job is poison); nil otherwise.
	// Not stored.
	ScheduleErr error
	// ClaimID, on a delayed job given to Schedule, also claims its id in
	// its lane's stream (schedule.go), so that the lane's de-duplication
	// sees it as it sees a job stored without a delay: for an id its
	// submitter chose, on a lane that keeps no job records. Not stored.
	ClaimID bool
}

// PubResult is JetStream's answer to a publish.
type PubResult struct {
	Seq uint64
	// Duplicate: a job with the same id is already stored (or was within
	// the dedup window); nothing new was queued.
	Duplicate bool
	// Queued, on a duplicate answered by Schedule: the job of that id was
	// stored in its lane without a delay, at Seq of the lane's stream.
	Queued bool
}

// Queue publishes jobs and hands out consumers. Safe for concurrent use.
type Queue struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger

	mu    sync.Mutex
	lanes map[string]*laneState
	// triesKV is TriesBucket as ensureTries made it, with triesReplicas.
	triesMu       sync.Mutex
	triesKV       jetstream.KeyValue
	triesReplicas int
	dead          jetstream.Stream
	retry         jetstream.Stream
	// deadEpoch is the dead-letter stream's creation time, in the msg
	// ids of replays (copy.go).
	deadEpoch int64
	// deadInbox gathers the answers of the dead-letter listings' batch
	// direct gets; deadNoBatch: the server answered one with one message
	// (deadlist.go); deadPageBytes, when not 0, bounds a listing's bytes
	// instead of deadPageBytes (tests).
	deadInbox     replies
	deadNoBatch   atomic.Bool
	deadPageBytes int
	// replays hears replayed dead letters (SetReplayHook).
	replays ReplayHook
	// hook hears delayed and expiring jobs (schedule.go).
	hook scheduleHook
	// id tells this Queue's read-ahead counts from other instances'.
	id string
}

type laneState struct {
	spec     LaneSpec
	stream   jetstream.Stream
	epoch    int64 // the lane stream's creation time (copy.go)
	consumer jetstream.Consumer
	retry    jetstream.Consumer // the lane's retry mover
	// keyed lanes: the intake stream of public subjects (intakein.go),
	// whose creation time makes its moves' msg ids; migrate says the lane
	// stream still holds jobs on public subjects (the former layout); and
	// who hears of stored jobs (OnStored)
	keyed bool
	tries jetstream.KeyValue // plain and ordered keyed lanes: TriesBucket
	// formerTries: the tries bucket held entries of the lane under the
	// name earlier releases gave them when the lane started (tries.go)
	formerTries bool
	in          jetstream.Stream
	inEpoch     int64
	migrate     bool
	onStored    func(key string)
	onPoison    func() // hears a poison job dead-lettered (OnPoison)
	// hears a public job of a keyed lane dropped as a duplicate when
	// moved (OnDuplicate)
	onDuplicate func()

	// flight shares the JetStream reads of Backlog and Ahead between
	// the requests that need them at once.
	flight singleflight.Group

	mu sync.Mutex
	// The backlog estimate: backlog is the stream's count from the stream
	// info read at readAt, which was asked for when this instance had
	// confirmed base publishes; confirmed counts them all. The estimate
	// backlog + confirmed − base can count a publish confirmed while that
	// info was on its way twice, never miss one.
	backlog   int64
	readAt    time.Time
	base      uint64
	confirmed uint64
	// keys: a keyed lane's busiest keys (at most keysN of them, most jobs
	// first) from the stream info read at keysAt.
	keys   []KeyCount
	keysN  int
	keysAt time.Time
	// subjects: a keyed lane's recent counts of keys' stored jobs (Ahead).
	subjects map[string]subjectCount
	// lastFetched is the highest stream sequence this instance fetched;
	// delivered the consumer's last delivered one (all instances) as of
	// deliveredAt. The jobs between them and a new job wait ahead of it.
	lastFetched uint64
	delivered   uint64
	deliveredAt time.Time
	// claims are the stream sequences of the claims of delayed jobs' ids
	// this instance stored (schedule.go) and Ahead has not passed yet,
	// ascending: no jobs, though they take sequences between jobs.
	claims []uint64
	// local is this instance's consumer of the lane, others the other
	// instances' read-ahead counts by id (readahead.go).
	local  *Consumer
	others map[string]readAheadCount
}

// fetched records that this instance fetched the lane's job at seq.
func (q *Queue) fetched(lane string, seq uint64) {
	ls, err := q.lane(lane)
	if err != nil {
		return
	}
	ls.mu.Lock()
	ls.lastFetched = max(ls.lastFetched, seq)
	ls.mu.Unlock()
}

// Ahead counts the lane's jobs stored before seq that no drain has fetched
// yet, or has fetched and not yet given a slot (readahead.go): they start
// before the job at seq. It reads the consumer's position
// from JetStream at most every maxAge (0: now), and uses this instance's own
// fetches in between, so it can only count too many, by what other
// instances fetched since. The claims of delayed jobs' ids (schedule.go)
// between take sequences and are no jobs: those this instance stored are
// not counted, those of other instances are (too many again).
//
// On a keyed lane only the jobs of the job's key wait ahead of it (each key
// has its own order and pace): the key's stored jobs, read from JetStream's
// count for the key's subject, less the job itself. Jobs of the key in
// flight still count (they leave the stream when settled), and so do jobs
// stored after seq by then: it can only count too many.
func (q *Queue) Ahead(ctx context.Context, lane, key string, seq uint64, maxAge time.Duration) (int64, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return 0, err
	}
	if ls.consumer == nil {
		if key == "" {
			return 0, nil
		}
		c, err := q.keyStored(ctx, ls, InternalSubject(lane, key), seq, maxAge)
		if err != nil {
			return 0, err
		}
		return max(int64(c.n)-1, 0), nil
	}
	ls.mu.Lock()
	stale := maxAge <= 0 || time.Since(ls.deliveredAt) >= maxAge
	ls.mu.Unlock()
	var infoErr error
	if stale {
		read := func() (any, error) { return nil, q.readDelivered(ctx, ls) }
		if maxAge > 0 {
			// Requests that find the position stale together share one
			// consumer info: under load, each asking its own made a herd
			// of JetStream API calls every maxAge.
			_, infoErr, _ = ls.flight.Do("ahead", read)
		} else {
			_, infoErr = read()
		}
	}
	ls.mu.Lock()
	pos := max(ls.lastFetched, ls.delivered)
	ls.mu.Unlock()
	if seq <= pos {
		return 0, infoErr
	}
	// Past the position: the jobs not fetched yet, less the claims
	// between (no jobs), and those the drains fetched and have not given
	// a slot (readahead.go).
	return int64(seq-pos-1) - ls.claimsBetween(pos, seq) + ls.readAheadOf(time.Now()), infoErr
}

// subjectCount is a keyed lane's count of one key's stored jobs, read at
// at from a stream whose last job then was lastSeq.
type subjectCount struct {
	n, lastSeq uint64
	at         time.Time
}

// maxSubjectCounts bounds the keys whose counts a lane keeps.
const maxSubjectCounts = 4096

// keyStored counts the stored jobs of subj, a key's subject, with the job
// at seq among them. A count read at most maxAge ago (0: now) that already
// saw the job at seq is reused; requests that need a read of the same
// subject at once share it.
func (q *Queue) keyStored(ctx context.Context, ls *laneState, subj string, seq uint64, maxAge time.Duration) (subjectCount, error) {
	if maxAge > 0 {
		ls.mu.Lock()
		c, ok := ls.subjects[subj]
		ls.mu.Unlock()
		if ok && time.Since(c.at) < maxAge && c.lastSeq >= seq {
			return c, nil
		}
		v, err, _ := ls.flight.Do(subj, func() (any, error) { return q.readSubject(ctx, ls, subj, maxAge) })
		if err != nil {
			return subjectCount{}, err
		}
		if c := v.(subjectCount); c.lastSeq >= seq {
			return c, nil
		}
		// The shared read was asked before the job at seq was stored:
		// its count may miss jobs of the key stored before this one.
	}
	return q.readSubject(ctx, ls, subj, maxAge)
}

// readSubject reads the count of subj's stored jobs from JetStream and
// keeps it for keyStored. The read is not cancelled with ctx: its result
// may be shared by other callers.
func (q *Queue) readSubject(ctx context.Context, ls *laneState, subj string, maxAge time.Duration) (subjectCount, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	asked := time.Now()
	si, err := ls.stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return subjectCount{}, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, ls.spec.Name, err)
	}
	c := subjectCount{n: si.State.Subjects[subj], lastSeq: si.State.LastSeq, at: asked}
	if maxAge <= 0 {
		return c, nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.subjects == nil {
		ls.subjects = make(map[string]subjectCount)
	}
	if len(ls.subjects) >= maxSubjectCounts {
		for k, old := range ls.subjects {
			if time.Since(old.at) >= maxAge {
				delete(ls.subjects, k)
			}
		}
		if len(ls.subjects) >= maxSubjectCounts {
			clear(ls.subjects)
		}
	}
	if old, ok := ls.subjects[subj]; !ok || old.at.Before(asked) {
		ls.subjects[subj] = c
	}
	return c, nil
}

// readDelivered reads the position of the lane's consumer from JetStream.
// The read is not cancelled with ctx: its result may be shared by other
// callers (Ahead).
func (q *Queue) readDelivered(ctx context.Context, ls *laneState) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	ci, err := ls.consumer.Info(ctx)
	if err != nil {
		return fmt.Errorf("%w: consumer info %s: %v", ErrUnavailable, ls.spec.Name, err)
	}
	ls.mu.Lock()
	ls.delivered, ls.deliveredAt = max(ls.delivered, ci.Delivered.Stream), time.Now()
	ls.mu.Unlock()
	return nil
}

// NotifyPrefix starts the subject on which an instance hears the slots its
// HTTP jobs were given (see HeaderNotify).
const NotifyPrefix = "throttler.notify."

// NotifySubject is instance's notify subject.
func NotifySubject(instance string) string { return NotifyPrefix + instance }

// notifyAddress keeps a Throttler-Notify value only when it is a notify
// subject: a message can never make the throttler publish anywhere else.
func notifyAddress(v string) string {
	id, ok := strings.CutPrefix(v, NotifyPrefix)
	if !ok || id == "" || len(id) > 64 {
		return ""
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return ""
		}
	}
	return v
}

// New returns a Queue on the connection nc. It starts nothing.
func New(nc *nats.Conn, logger *slog.Logger) (*Queue, error) {
	// An asynchronous publish (PublishBatch) whose acknowledgement never
	// comes is failed after publishTimeout, like a synchronous one.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(publishTimeout))
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Queue{nc: nc, js: js, log: logger, lanes: map[string]*laneState{}, id: nuid.Next()}, nil
}

// EnsureLane creates or updates the lane's stream and consumer to match spec.
// It is idempotent.
func (q *Queue) EnsureLane(ctx context.Context, spec LaneSpec) error {
	if spec.Replicas == 0 {
		spec.Replicas = 1
	}
	if spec.Prefetch < 1 {
		spec.Prefetch = 1
	}
	maxMsgSize := int32(spec.MaxBody + HeaderRoom)
	if st, err := q.js.Stream(ctx, StreamName(spec.Name)); err == nil && st.CachedInfo().Config.Retention != jetstream.WorkQueuePolicy {
		// The lane was keyed: its jobs wait in this stream and in its
		// intake stream, which no unkeyed lane reads.
		name, in := StreamName(spec.Name), IntakeStreamName(spec.Name)
		return fmt.Errorf("queue: lane %s is not keyed but its stream %s was made for a keyed lane (per_key); "+
			"its jobs are kept: put per_key back and let the lane drain, then delete its streams (nats stream rm %s; nats stream rm %s) "+
			"before making the lane unkeyed", spec.Name, name, name, in)
	}
	st, err := ensureStream(ctx, q.js, jetstream.StreamConfig{
		Name:        StreamName(spec.Name),
		Description: "throttler lane " + spec.Name,
		Subjects: []string{Subject(spec.Name, ""), Subject(spec.Name, ">"),
			InternalSubject(spec.Name, ""), InternalSubject(spec.Name, ">")},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		MaxMsgs:    spec.MaxBacklog,
		MaxBytes:   maxBytes(spec.MaxBytes),
		Discard:    jetstream.DiscardNew,
		MaxMsgSize: maxMsgSize,
		Duplicates: spec.DedupWindow,
		Replicas:   spec.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: stream for lane %s: %w", spec.Name, err)
	}
	cons, err := ensureConsumer(ctx, st, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "throttler drain of lane " + spec.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       spec.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// Every fetched job counts, waiting for its slot or delivering, on
		// any instance: max_inflight is a global bound. Retries wait in
		// their own stream, so they do not take places here.
		MaxAckPending: spec.MaxInflight,
		MaxDeliver:    -1,
		Replicas:      spec.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: consumer for lane %s: %w", spec.Name, err)
	}
	retry, err := q.ensureRetryConsumer(ctx, spec)
	if err != nil {
		return err
	}
	tries, err := q.ensureTries(ctx, spec.Replicas)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		// A server before 2.11: the lane runs, its jobs waiting in place
		// counted by each instance alone (inplace.go).
		q.log.Warn("the server cannot hold the tries bucket; jobs retried in place are counted per instance", "lane", spec.Name, "bucket", TriesBucket, "err", err)
	} else if err != nil {
		return err
	}
	q.mu.Lock()
	q.lanes[spec.Name] = &laneState{spec: spec, stream: st, epoch: st.CachedInfo().Created.UnixNano(), consumer: cons, retry: retry, tries: tries}
	q.mu.Unlock()
	return nil
}

func maxBytes(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

func (q *Queue) lane(name string) (*laneState, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ls, ok := q.lanes[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownLane, name)
	}
	return ls, nil
}

// Publish stores job durably. A nil error means JetStream confirmed the write
// (or that the id is a duplicate of a stored job).
func (q *Queue) Publish(ctx context.Context, job Job) (PubResult, error) {
	ls, err := q.lane(job.Lane)
	if err != nil {
		return PubResult{}, err
	}
	ack, err := q.publish(ctx, InternalSubject(job.Lane, job.Key), jobMsg(job))
	if err != nil {
		return PubResult{}, fmt.Errorf("lane %s: %w", job.Lane, err)
	}
	if !ack.Duplicate {
		ls.mu.Lock()
		ls.confirmed++
		ls.mu.Unlock()
		ls.stored(job.Key)
	}
	return PubResult{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// jobHeaders is the most headers jobMsg sets on a message (never both
// Throttler-Via and Throttler-Owner: a job from outside has no owner).
const jobHeaders = 17

// jobMsg encodes a job as a message of the lane stream. The header keys are
// canonical already (TestJobMsgHeaderKeys), so the map is filled directly,
// its values sharing one array: Header.Set would allocate a slice a value.
// A header added past jobHeaders costs an allocation, never a panic;
// TestJobMsgHeaderCount keeps jobHeaders the most a job sets.
func jobMsg(job Job) *nats.Msg {
	var keysA, valsA [jobHeaders]string
	keys, vals := keysA[:0], valsA[:0]
	add := func(k, v string) {
		keys, vals = append(keys, k), append(vals, v)
	}
	if job.ContentType != "" {
		add(HeaderContentType, job.ContentType)
	}
	if job.ID != "" {
		// A job stored under its own id (every intake) says it once:
		// decodeJob reads the id from Nats-Msg-Id when Throttler-Job-Id is
		// absent, and JetStream parses one header less per message.
		if job.MsgID != "" && job.MsgID != job.ID {
			add(HeaderJobID, job.ID)
			add(jetstream.MsgIDHeader, job.MsgID)
		} else {
			add(jetstream.MsgIDHeader, job.ID)
		}
	}
	if job.Outside {
		add(HeaderVia, "nats")
	}
	if job.Notify != "" {
		add(HeaderNotify, job.Notify)
	}
	if job.Wait != "" {
		add(HeaderWait, job.Wait)
	}
	if job.Callback != "" {
		add(HeaderCallback, job.Callback)
	}
	if job.Reply != "" {
		add(HeaderReplyStored, job.Reply)
	}
	if job.ID == "" && job.IDPrefix != "" {
		add(HeaderIDPrefix, job.IDPrefix)
	}
	if job.NotifyID != "" {
		add(HeaderNotifyID, job.NotifyID)
	}
	if job.RecordRev != 0 {
		add(HeaderRecordRev, strconv.FormatUint(job.RecordRev, 10))
	}
	if job.Owner != "" && !job.Outside {
		add(HeaderOwner, job.Owner)
	}
	if job.ReplayedFrom != 0 {
		add(HeaderReplayedFrom, strconv.FormatUint(job.ReplayedFrom, 10))
	}
	if job.Attempts > 0 {
		add(HeaderAttempts, strconv.Itoa(job.Attempts))
	}
	if !job.NotBefore.IsZero() {
		add(HeaderNotBefore, strconv.FormatInt(job.NotBefore.UnixMilli(), 10))
	}
	if !job.Expires.IsZero() {
		add(headerExpiresAt, strconv.FormatInt(job.Expires.UnixMilli(), 10))
	}
	if !job.EnqueuedAt.IsZero() {
		add(HeaderEnqueuedAt, strconv.FormatInt(job.EnqueuedAt.UnixMilli(), 10))
	}
	if t := job.Trace; !t.IsZero() {
		if t.Parent != "" {
			add(headerTraceparent, t.Parent)
		}
		if t.State != "" {
			add(headerTracestate, t.State)
		}
		if t.Baggage != "" {
			add(headerBaggage, t.Baggage)
		}
	}
	addDest(job.Dest, add)
	n := len(keys)
	h := make(nats.Header, n)
	shared := make([]string, n)
	copy(shared, vals)
	for i := range n {
		h[keys[i]] = shared[i : i+1 : i+1]
	}
	return &nats.Msg{Subject: InternalSubject(job.Lane, job.Key), Header: h, Data: job.Payload}
}

// publishTimeout bounds a publish whose context has no deadline.
const publishTimeout = 3 * time.Second

// publish stores msg on subject and classifies the failure: a lane at its
// max_backlog (ErrBacklogFull), a stream or server out of space (ErrFull),
// anything else (ErrUnavailable). A missing deadline gets publishTimeout.
func (q *Queue) publish(ctx context.Context, subject string, msg *nats.Msg) (*jetstream.PubAck, error) {
	msg.Subject = subject
	if !q.nc.IsConnected() {
		// The client would buffer the publish until it reconnects; the
		// caller must hear now that nothing was stored.
		return nil, fmt.Errorf("%w: not connected to NATS (%v)", ErrUnavailable, q.nc.Status())
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, publishTimeout)
		defer cancel()
	}
	ack, err := q.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, q.classify(ctx, msg.Subject, err)
	}
	return ack, nil
}

// JetStream error codes the publish path tells apart (nats-server's
// errors.json). A store refused by a stream limit comes back as
// codeStoreFailed whichever limit it was; the stream's state says which.
const (
	codeStoreFailed            jetstream.ErrorCode = 10077 // JSStreamStoreFailedF
	codeInsufficientResources  jetstream.ErrorCode = 10023 // JSInsufficientResourcesErr
	codeStorageResourcesExceed jetstream.ErrorCode = 10047 // JSStorageResourcesExceededErr
	codeMemoryResourcesExceed  jetstream.ErrorCode = 10028 // JSMemoryResourcesExceededErr
	codeAccountResourcesExceed jetstream.ErrorCode = 10002 // JSAccountResourcesExceededErr
	codeMessageExceedsMaximum  jetstream.ErrorCode = jetstream.JSErrCodeStreamMessageExceedsMaximum
)

// classify turns a failed publish into ErrBacklogFull (the stream holds
// MaxMsgs), ErrFull (MaxBytes, or the server out of storage) or
// ErrUnavailable (anything else: the job may not be stored), by the error
// code JetStream answered, never by its text.
func (q *Queue) classify(ctx context.Context, subject string, err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	switch apiErr.ErrorCode {
	case codeStoreFailed:
		if q.atMaxMsgs(ctx, subject) {
			return fmt.Errorf("queue: %w: %w", ErrBacklogFull, err)
		}
		return fmt.Errorf("%w: %w", ErrFull, err)
	case codeInsufficientResources, codeStorageResourcesExceed, codeMemoryResourcesExceed, codeAccountResourcesExceed, codeMessageExceedsMaximum:
		return fmt.Errorf("%w: %w", ErrFull, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// atMaxMsgs reports whether the stream that takes subject holds its MaxMsgs.
// Only the failure path asks: a refused store names no limit in its code.
func (q *Queue) atMaxMsgs(ctx context.Context, subject string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	name, err := q.js.StreamNameBySubject(ctx, subject)
	if err != nil {
		return false
	}
	st, err := q.js.Stream(ctx, name)
	if err != nil {
		return false
	}
	info := st.CachedInfo()
	return info.Config.MaxMsgs > 0 && int64(info.State.Msgs) >= info.Config.MaxMsgs
}

// Backlog estimates the jobs of lane that are stored and not yet done
// (waiting or in flight): JetStream's count, reused while younger than
// maxAge, plus what this instance published since it was asked for. maxAge
// 0 always asks JetStream and returns its count. The estimate never counts
// fewer jobs than JetStream held when it was read plus this instance's
// publishes since; the stream's own MaxMsgs is the exact bound.
func (q *Queue) Backlog(ctx context.Context, lane string, maxAge time.Duration) (int64, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return 0, err
	}
	ls.mu.Lock()
	fresh := maxAge > 0 && time.Since(ls.readAt) < maxAge
	n := ls.estimate()
	ls.mu.Unlock()
	if fresh {
		return n, nil
	}
	if !q.nc.IsConnected() {
		return n, fmt.Errorf("%w: not connected to NATS (%v)", ErrUnavailable, q.nc.Status())
	}
	read := func() (any, error) { return q.readBacklog(ctx, ls) }
	if maxAge <= 0 {
		v, err := read()
		if err != nil {
			return n, err
		}
		return v.(int64), nil
	}
	// Requests that find the count stale together share one stream info
	// (see Ahead); a fresh read (maxAge 0) is always its own. A request
	// joining a shared read may have seen publishes that read does not
	// count: it answers with the estimate, which keeps them on top.
	if _, err, _ := ls.flight.Do("backlog", read); err != nil {
		return n, err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.estimate(), nil
}

// readBacklog reads the lane's stored jobs from JetStream, which become
// the base of the backlog estimate (readStream). The read is not cancelled with ctx: its result
// may be shared by other callers (Backlog).
func (q *Queue) readBacklog(ctx context.Context, ls *laneState) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	info, err := ls.readStream(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, ls.spec.Name, err)
	}
	return int64(info.State.Msgs), nil
}

// estimate is the backlog estimate; ls.mu is held.
func (ls *laneState) estimate() int64 {
	return ls.backlog + int64(ls.confirmed-ls.base)
}

// readStream reads the lane stream's info (with opts, such as a subject
// filter) and makes its count the base of the backlog estimate.
func (ls *laneState) readStream(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	ls.mu.Lock()
	asked := ls.confirmed
	ls.mu.Unlock()
	info, err := ls.stream.Info(ctx, opts...)
	if err != nil {
		return nil, err
	}
	if testHookStreamRead != nil {
		testHookStreamRead()
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	// Publishes confirmed since asked may be in info's count or not: they
	// stay counted on top of it, also when a read asked for later has
	// already answered.
	ls.backlog, ls.base, ls.readAt = int64(info.State.Msgs), asked, time.Now()
	return info, nil
}

// testHookStreamRead runs in readStream between the stream info's answer
// and its use: a test publishes there. nil outside tests.
var testHookStreamRead func()

// LaneStats are live counts of one lane from JetStream.
type LaneStats struct {
	// Stored: jobs in the stream (waiting or in flight); on a keyed lane
	// also the jobs published and not yet moved onto their keys.
	Stored uint64
	// Pending: jobs no instance has fetched yet.
	Pending uint64
	// AckPending: jobs fetched and not yet answered.
	AckPending int
	// Redelivered: jobs handed out more than once and not yet answered.
	Redelivered int
}

// Stats reads the lane's live counts from JetStream.
func (q *Queue) Stats(ctx context.Context, lane string) (LaneStats, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return LaneStats{}, err
	}
	si, err := ls.stream.Info(ctx)
	if err != nil {
		return LaneStats{}, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, lane, err)
	}
	if ls.consumer == nil {
		// A keyed lane: no consumer counts what is in flight; the lane's
		// runtime knows its own. Jobs published and not yet moved onto
		// their keys wait in the intake stream: they are backlog too.
		n := si.State.Msgs
		if ls.in != nil {
			ii, err := ls.in.Info(ctx)
			if err != nil {
				return LaneStats{}, fmt.Errorf("%w: intake stream info %s: %v", ErrUnavailable, lane, err)
			}
			n += ii.State.Msgs
		}
		return LaneStats{Stored: n, Pending: n}, nil
	}
	ci, err := ls.consumer.Info(ctx)
	if err != nil {
		return LaneStats{}, fmt.Errorf("%w: consumer info %s: %v", ErrUnavailable, lane, err)
	}
	return LaneStats{Stored: si.State.Msgs, Pending: ci.NumPending, AckPending: ci.NumAckPending, Redelivered: ci.NumRedelivered}, nil
}

// KeyCount is one key of a keyed lane and its stored jobs.
type KeyCount struct {
	Key    string
	Stored uint64
}

// BusiestKeys lists the n keys of a keyed lane with the most jobs stored
// (waiting or in flight), most first, ties by key. JetStream counts them
// per subject; the answer is paged by the client, so a lane with many keys
// costs one larger stream info, not one call per key. Like Backlog, it
// reuses the counts of a read younger than maxAge (0: read them now), so
// that a status polled often costs at most one such read per lane and
// maxAge; the read also refreshes the backlog estimate.
func (q *Queue) BusiestKeys(ctx context.Context, lane string, n int, maxAge time.Duration) ([]KeyCount, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return nil, err
	}
	ls.mu.Lock()
	if maxAge > 0 && n <= ls.keysN && time.Since(ls.keysAt) < maxAge {
		out := slices.Clone(ls.keys[:min(n, len(ls.keys))])
		ls.mu.Unlock()
		return out, nil
	}
	ls.mu.Unlock()
	si, err := ls.readStream(ctx, jetstream.WithSubjectFilter(InternalSubject(lane, "")+".>"))
	if err != nil {
		return nil, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, lane, err)
	}
	out := make([]KeyCount, 0, len(si.State.Subjects))
	for subj, c := range si.State.Subjects {
		if _, key, ok := subjectKey(lane, subj); ok && key != "" && c > 0 {
			out = append(out, KeyCount{Key: key, Stored: c})
		}
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		if c := cmp.Compare(b.Stored, a.Stored); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	out = out[:min(n, len(out))]
	ls.mu.Lock()
	ls.keys, ls.keysN, ls.keysAt = out, n, time.Now()
	ls.mu.Unlock()
	return slices.Clone(out), nil
}

// jobFromMsg decodes a message of the lane's stream (see intake.go for
// what each subject may tell).
func jobFromMsg(lane string, m jetstream.Msg, meta *jetstream.MsgMetadata) Job {
	internal, key, _ := subjectKey(lane, m.Subject())
	job := decodeJob(lane, m.Headers(), m.Data(), key, meta.Sequence.Stream, internal, time.Now())
	if job.EnqueuedAt.IsZero() {
		job.EnqueuedAt = meta.Timestamp
	}
	return job
}
