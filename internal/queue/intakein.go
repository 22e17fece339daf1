package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A keyed lane's intake stream.
//
// Jobs published on a keyed lane's public subjects are stored in the lane's
// intake stream, THROTTLE-INTAKE_<lane> (limits retention, MaxMsgs =
// max_backlog, DiscardNew, the lane's dedup window for the publishers'
// Nats-Msg-Id). RunIntake moves them, oldest first, into the lane stream on
// their keys' internal subjects, as the lane stream has room: a move is a
// publish with a Nats-Msg-Id, and the original is deleted only after the
// lane stream confirmed the copy (or answered that it already holds that
// msg id). So a job is never lost, and a move repeated after a crash, or
// by a second instance moving the same job, is a duplicate JetStream drops
// while the repeat comes within the lane's dedup window (after a longer
// outage the job is stored twice: delivered at least once).
//
// The move's msg id (intakeMsgID) is the job's id when its publisher gave
// it (its Nats-Msg-Id), as a job submitted over HTTP is stored under its
// Idempotency-Key: the lane stream then de-duplicates an id across both
// ways in, as a plain lane's stream does, whichever is stored first. A job
// the throttler named "<lane>-<intake sequence>" (LaneSeqID) is moved
// under "<job id> intake-<stream created>-<sequence>": the intake stream's
// sequences start again when it is re-created, and its creation time keeps
// the two apart. A delayed job is stored in the retry stream, shared by
// every lane, under that second form too, and its given id is claimed in
// the lane stream (claimID) as a delayed HTTP job's is.
//
// Only the throttler writes the lane stream of a keyed lane: it takes the
// internal subjects alone, which the documented permissions keep from
// publishers (docs/OPERATIONS.md). A msg id held there is a job the
// throttler stored (over HTTP, moved from the intake, a claim) or one of
// its copies, whose ids hold a space, which no given id may (ValidJobID).
// So a duplicate answer to a move always means the lane holds a job of
// that id, and is believed: the original is deleted, and dropped is only
// the job being moved, a job of the same id as one its lane holds. A job
// published over NATS whose id its lane stream already held is thus never
// delivered; its publisher had its PubAck from the intake stream, so the
// drop is logged and heard by OnDuplicate (the lane counts it).
//
// Every instance runs a mover. Each reads the oldest job left and never
// passes a job it could not move, so the keys' jobs reach
// their internal subjects in the order they were published (FIFO per key),
// whichever instance moves them.

// IntakeStreamName returns the stream that takes a keyed lane's public
// subjects. A lane's own stream starts "THROTTLE_", so the two never meet.
func IntakeStreamName(lane string) string { return "THROTTLE-INTAKE_" + lane }

// Intake pacing: how long a mover waits when the intake stream is empty
// (growing from intakeIdleMin to intakeIdleMax while it stays empty), when
// the lane stream is full (the same), and after JetStream failed.
const (
	intakeIdleMin = 5 * time.Millisecond
	intakeIdleMax = 100 * time.Millisecond
	intakeFailed  = time.Second
)

// testHookMoved runs after a move was confirmed and before its original is
// deleted; when it returns true the mover stops there, as if the instance
// died. nil outside tests.
var testHookMoved func(seq uint64) bool

// publicLeft counts the jobs a keyed lane's stream still holds on the
// lane's public subjects (the former layout); a direct get finds out first
// whether there are any.
func publicLeft(ctx context.Context, st jetstream.Stream, lane string) (uint64, error) {
	var n uint64
	for _, subj := range []string{Subject(lane, ">"), Subject(lane, "")} {
		if raw, err := getNext(ctx, st, 1, subj); err != nil {
			return 0, err
		} else if raw == nil {
			continue
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err != nil {
			return 0, fmt.Errorf("stream info: %w", err)
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n, nil
}

// getNext reads the first message on subject (a filter) at or after the
// stream sequence from, or nil when there is none.
func getNext(ctx context.Context, st jetstream.Stream, from uint64, subject string) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	raw, err := st.GetMsg(ctx, max(from, 1), jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", ErrUnavailable, subject, err)
	}
	return raw, nil
}

// RunIntake moves the jobs published on a keyed lane's public subjects onto
// their keys until ctx ends: first those a lane stream of the former layout
// still holds, then the intake stream's. A poison job (poison.go: no key,
// an invalid key, a payload over max_body) is dead-lettered with the
// reason.
func (q *Queue) RunIntake(ctx context.Context, lane string, log *slog.Logger) {
	ls, err := q.lane(lane)
	if err != nil || ls.in == nil {
		return
	}
	if ls.migrate && !q.migrate(ctx, ls, log) {
		return
	}
	// Every message of the intake stream, whatever its subject: a filter
	// of the lane's subjects would pass over jobs published on the bare
	// throttle.<lane> (no key), and over subjects that nats-server's
	// subject index does not match to throttle.<lane>.> (a byte 0x7f, its
	// internal pivot): they would stay, each taking a place of
	// max_backlog, until the intake stream refused every publish.
	q.drainIntake(ctx, ls, ls.in, ">", func(job *Job, seq uint64) {
		job.MsgID = intakeSeqMsgID(job.ID, ls.inEpoch, seq)
	}, log)
}

// intakeSeqMsgID is the msg id of a move, from the intake stream created
// at epoch, of the job id stored there at seq, made for a job whose id the
// throttler made, and for a delayed job's copy in the retry stream.
func intakeSeqMsgID(id string, epoch int64, seq uint64) string {
	return fmt.Sprintf("%s intake-%d-%d", id, epoch, seq)
}

// givenID reports whether a public job of lane has the id its publisher
// gave it (its Nats-Msg-Id): one not made by the throttler, which no
// publisher's id may look like (ValidGivenID).
func givenID(lane, id string) bool {
	_, made := LaneSeqID(lane, id)
	return !made
}

// migrate moves the jobs a lane stream of the former layout holds on public
// subjects (keyed ones first, then those published without a key, which
// are dead-lettered), then gives the lane stream back its MaxMsgs. It
// reports false when ctx ended or a test stopped it first.
func (q *Queue) migrate(ctx context.Context, ls *laneState, log *slog.Logger) bool {
	lane := ls.spec.Name
	log.Info("moving the jobs of the former layout's public subjects onto their keys")
	for _, subj := range []string{Subject(lane, ">"), Subject(lane, "")} {
		// The former intake's msg id: a move it made before the
		// upgrade, and not yet deleted, is a duplicate of this one.
		if !q.drainIntake(ctx, ls, ls.stream, subj, func(job *Job, seq uint64) {
			job.MsgID = fmt.Sprintf("%s#in-%d", job.ID, seq)
		}, log) {
			return false
		}
	}
	for ctx.Err() == nil {
		err := func() error {
			uctx, cancel := context.WithTimeout(ctx, publishTimeout)
			defer cancel()
			info, err := ls.stream.Info(uctx)
			if err != nil {
				return err
			}
			if info.Config.MaxMsgs == ls.spec.MaxBacklog {
				return nil
			}
			cfg := info.Config
			cfg.MaxMsgs = ls.spec.MaxBacklog
			_, err = q.js.UpdateStream(uctx, cfg)
			return err
		}()
		if err == nil {
			log.Info("former layout's public jobs moved; the lane stream holds max_backlog again")
			ls.mu.Lock()
			ls.migrate = false
			ls.mu.Unlock()
			return true
		}
		log.Warn("restoring the lane stream's max_backlog failed; trying again", "err", err)
		sleep(ctx, intakeFailed)
	}
	return false
}

// drainIntake moves the jobs stored in st on subject (a filter), oldest
// first, naming each move with msgID. With the lane stream's own
// former public subjects it returns true once none is left; with the
// intake stream it runs until ctx ends (or a test stops it) and returns
// false.
func (q *Queue) drainIntake(ctx context.Context, ls *laneState, st jetstream.Stream, subject string, msgID func(*Job, uint64), log *slog.Logger) bool {
	once := st != ls.in
	idle, full := intakeIdleMin, intakeIdleMin
	for ctx.Err() == nil {
		// Always the oldest job left: a move deletes its original, so
		// that is the next one to move, whichever instance moved the
		// others; one whose delete failed is read and moved again (a
		// duplicate). No cursor, so a purged or re-created stream is
		// read from its start.
		raw, err := getNext(ctx, st, 1, subject)
		if err != nil {
			log.Debug("reading the keyed intake failed", "err", err)
			sleep(ctx, intakeFailed)
			continue
		}
		if raw == nil {
			if once {
				return true
			}
			sleep(ctx, idle)
			idle = min(2*idle, intakeIdleMax)
			continue
		}
		idle = intakeIdleMin
		switch err := q.moveIn(ctx, ls, st, raw, msgID); {
		case errors.Is(err, errStopped):
			return false
		case errors.Is(err, ErrBacklogFull), errors.Is(err, ErrFull):
			// Read it again after the wait: another instance may
			// have moved it meanwhile.
			if full == intakeIdleMin {
				log.Debug("keyed lane stream full; public jobs wait in the intake stream", "seq", raw.Sequence)
			}
			sleep(ctx, full)
			full = min(2*full, intakeIdleMax)
		case err != nil:
			log.Warn("moving a public job to its key failed; trying again", "seq", raw.Sequence, "err", err)
			sleep(ctx, intakeFailed)
		default:
			full = intakeIdleMin
		}
	}
	return false
}

// errStopped: a test stopped the mover between a move and its delete.
var errStopped = errors.New("queue: intake mover stopped")

// moveIn moves one public job, stored in from at raw.Sequence, onto its
// key's internal subject, then deletes the original. A poison job
// (poison.go) is dead-lettered instead.
func (q *Queue) moveIn(ctx context.Context, ls *laneState, from jetstream.Stream, raw *jetstream.RawStreamMsg, msgID func(*Job, uint64)) error {
	lane, seq := ls.spec.Name, raw.Sequence
	_, key, _ := subjectKey(lane, raw.Subject)
	job := decodeJob(lane, raw.Header, raw.Data, key, seq, false, time.Now())
	job.EnqueuedAt = raw.Time
	applyPublicSchedule(&job, raw.Header, raw.Time, ls.spec.MaxDelay)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	reason := urlKey(ls.spec, &job)
	if reason == "" {
		reason = poisonReason(ls.spec, job, true)
	}
	key = job.Key
	if reason != "" {
		src := origin(StreamName(lane), ls.epoch)
		if from == ls.in {
			src = origin(IntakeStreamName(lane), ls.inEpoch)
		}
		meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumDelivered: 1, Timestamp: raw.Time}
		msg := &Msg{job: job, m: &deleteAck{st: from, seq: seq}, meta: meta, origin: src,
			c: &Consumer{q: q, lane: lane, outstanding: map[*Msg]time.Time{}}}
		return q.deadPoison(pctx, msg, ls.spec, reason, raw.Subject)
	}
	msgID(&job, seq)
	job.Outside = true // counted as NATS intake when it starts
	// Only the intake stream's moves de-duplicate by a given id: a lane
	// stream of the former layout stored the job on its public subject
	// under that id already, and a copy under it would be dropped as a
	// duplicate of its own original.
	given := from == ls.in && givenID(lane, job.ID)
	if !job.NotBefore.IsZero() && time.Until(job.NotBefore) > notBeforeSlack {
		// Its publisher asked for a delay: it waits in the retry stream
		// (schedule.go), under this move's msg id, until due.
		job.EnqueuedAt = time.Time{}
		copied := job
		if given {
			// As Schedule's: the retry mover may not move the copy into
			// the lane before the claim said whether the id's job is
			// there already.
			copied.NotBefore = later(job.NotBefore, time.Now().Add(claimGuard))
		}
		ack, err := q.storeScheduled(pctx, copied)
		if err != nil {
			return err
		}
		res := PubResult{Seq: ack.Sequence, Duplicate: ack.Duplicate}
		if given {
			if res, err = q.claimID(pctx, ls, job, res); err != nil {
				return err
			}
		}
		if res.Queued {
			q.droppedDuplicate(ls, job, seq, res.Seq)
		} else if h := q.hook.get(); h != nil {
			h.Scheduled(lane, job.ID, job.NotBefore, job.Reply)
		}
	} else if job.NotBefore = (time.Time{}); from == ls.in {
		if given {
			job.MsgID = job.ID
		}
		ack, err := q.publish(pctx, InternalSubject(lane, key), jobMsg(job))
		if err != nil {
			return err
		}
		if !ack.Duplicate {
			ls.mu.Lock()
			ls.confirmed++
			ls.mu.Unlock()
		} else if given {
			q.droppedDuplicate(ls, job, seq, ack.Sequence)
		}
		ls.stored(key)
	} else if err := q.moveFormer(pctx, ls, job, seq); err != nil {
		return err
	}
	if h := testHookMoved; h != nil && h(seq) {
		return errStopped
	}
	if err := from.DeleteMsg(pctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		// Moved but still there: the next read finds it again, and its
		// move is a duplicate.
		return fmt.Errorf("%w: delete moved job %d: %v", ErrUnavailable, seq, err)
	}
	return nil
}

// droppedDuplicate tells of a job published over NATS, at seq of the
// intake stream, that was not stored: its lane stream holds a job of its
// id (at laneSeq: in the lane, or for a delayed job the claim's place).
// Its publisher had its PubAck already, so the log and OnDuplicate are all
// that hear of it. A move repeated after a crash between its store and
// its delete is heard too: the two cannot be told apart once the first
// copy has left the lane.
func (q *Queue) droppedDuplicate(ls *laneState, job Job, seq, laneSeq uint64) {
	ls.mu.Lock()
	f := ls.onDuplicate
	ls.mu.Unlock()
	if f != nil {
		f()
	}
	q.log.Info("a job published over NATS was not stored: its lane already holds a job with its id",
		"lane", job.Lane, "id", job.ID, "key", job.Key, "intake_seq", seq, "lane_seq", laneSeq)
}

// OnDuplicate registers f to hear every job published on a keyed lane's
// public subjects that was dropped as a duplicate when it was moved into
// its lane (droppedDuplicate). f must be cheap and must not block.
func (q *Queue) OnDuplicate(lane string, f func()) {
	ls, err := q.lane(lane)
	if err != nil {
		return
	}
	ls.mu.Lock()
	ls.onDuplicate = f
	ls.mu.Unlock()
}

// moveFormer moves a job a lane stream of the former layout holds at seq
// on a public subject. Its msg id, the former intake's, has no space, so a
// duplicate answer is checked against the stored copy, as republish does;
// but a copy made before a crash may already have been read and settled
// (deleted) when the move is repeated. The lane stream no longer takes
// public subjects, and a copy is always stored after its original: a
// duplicate answer naming a message that is gone and came after seq is
// that copy, and the job is not stored again.
func (q *Queue) moveFormer(ctx context.Context, ls *laneState, job Job, seq uint64) error {
	ack, err := q.publish(ctx, InternalSubject(job.Lane, job.Key), jobMsg(job))
	if err != nil {
		return fmt.Errorf("lane %s: %w", job.Lane, err)
	}
	if ack.Duplicate {
		// One read: the copy may be settled between two.
		raw, gerr := ls.stream.GetMsg(ctx, ack.Sequence)
		switch {
		case errors.Is(gerr, jetstream.ErrMsgNotFound) && ack.Sequence > seq:
			return nil // the copy, read and settled already
		case gerr != nil || !rawIsCopy(raw, job):
			// Not shown to be the copy: store it under a fresh id.
			return q.republish(ctx, job)
		}
	}
	ls.stored(job.Key)
	return nil
}

// deleteAck settles a public job that was dead-lettered: done deletes it;
// handed back it stays, and the mover reads it again.
type deleteAck struct {
	st  jetstream.Stream
	seq uint64
}

func (a *deleteAck) Ack() error {
	ctx, cancel := context.WithTimeout(context.Background(), getTimeout)
	defer cancel()
	err := a.st.DeleteMsg(ctx, a.seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		err = nil
	}
	return err
}
func (a *deleteAck) DoubleAck(context.Context) error  { return a.Ack() }
func (a *deleteAck) Nak() error                       { return nil }
func (a *deleteAck) NakWithDelay(time.Duration) error { return nil }
func (a *deleteAck) InProgress() error                { return nil }

// PublicJobsWaiting counts jobs published on a keyed lane's public subjects
// and not yet moved to their keys: the intake stream's.
func (q *Queue) PublicJobsWaiting(ctx context.Context, lane string) (uint64, error) {
	ls, err := q.lane(lane)
	if err != nil || ls.in == nil {
		return 0, err
	}
	info, err := ls.in.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: intake stream %s: %v", ErrUnavailable, lane, err)
	}
	return info.State.Msgs, nil
}
