package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Internal message ids.
//
// Every message the throttler writes with a Nats-Msg-Id of its own (a
// retry copy, a dead letter, a retry moved back or a dead letter replayed
// into its lane) names the event that wrote it: what kind of write, the
// stream and stream sequence of the message it copies, that stream's
// creation time (a re-created stream starts its sequences again) and, for
// a retry, the attempt. The stream names the lane. So two lanes, or two
// failures of one job on one lane, never share an id, while the same event
// repeated after a crash (its copy stored, the original's ack lost) writes
// the same id again and JetStream drops the repeat as a duplicate.
//
// The ids hold spaces, which no job id may (ValidJobID). A duplicate
// answer is still never taken on trust: storeCopy reads the message it
// names and compares it with the write; another message under the same id
// is an error (ErrNotTheCopy), and the original is not settled.

// ErrNotTheCopy: JetStream answered that a message with this write's id is
// stored already, but the stored message is not this write's copy (another
// subject, job or id). Nothing was stored; the original stays.
var ErrNotTheCopy = errors.New("queue: a stored message holds this copy's id but is not the copy")

// origin names a stream for an event id: its name and creation time.
func origin(stream string, created int64) string {
	return fmt.Sprintf("%s %d", stream, created)
}

// retryMsgID is the id of m's retry copy: one per lane, message and attempt.
func (m *Msg) retryMsgID() string {
	return fmt.Sprintf("retry %s %d %d", m.origin, m.Seq(), m.job.Attempts+1)
}

// deadMsgID is the id of m's dead letter: one per lane and message.
func (m *Msg) deadMsgID() string {
	return fmt.Sprintf("dead %s %d", m.origin, m.Seq())
}

// storeCopy stores msg, the throttler's copy of a job, in st, a stream
// only the throttler writes (retries, dead letters). A duplicate answer is
// believed only when the message it names is this copy: same subject, job
// id and msg id. A message that has left the stream since (a retry moved
// back, a dead letter replayed, deleted or aged out) is taken as the copy:
// nobody but the throttler writes these streams, and only this event
// writes this id.
func (q *Queue) storeCopy(ctx context.Context, st jetstream.Stream, msg *nats.Msg) error {
	ack, err := q.publish(ctx, msg.Subject, msg)
	if err != nil {
		return err
	}
	if !ack.Duplicate {
		return nil
	}
	// From the leader: a replica may not hold the copy yet.
	raw, err := q.leaderGet(ctx, st.CachedInfo().Config.Name, ack.Sequence, "")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: read the stored copy %d: %v", ErrUnavailable, ack.Sequence, err)
	}
	if raw.Subject != msg.Subject || raw.Header.Get(HeaderJobID) != msg.Header.Get(HeaderJobID) ||
		raw.Header.Get(jetstream.MsgIDHeader) != msg.Header.Get(jetstream.MsgIDHeader) {
		q.log.Error("a stored message holds the id of the throttler's copy of a job but is another message; the job stays where it is",
			"subject", msg.Subject, "msg_id", msg.Header.Get(jetstream.MsgIDHeader), "seq", ack.Sequence,
			"stored_subject", raw.Subject, "stored_job_id", raw.Header.Get(HeaderJobID))
		return fmt.Errorf("%w: %s #%d", ErrNotTheCopy, raw.Subject, ack.Sequence)
	}
	return nil
}
