package queue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/records"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// NATS subject intake: what a stored message may tell the throttler about
// its job.
//
// A lane's stream takes two kinds of subject. The public ones,
// throttle.<lane> and throttle.<lane>.<key>, are where outside services
// publish jobs (plain JetStream publishes; the stream stores them even while
// no throttler instance runs). The internal ones, throttler.lane.<lane> and
// throttler.lane.<lane>.<key>, are where the throttler itself stores jobs:
// taken over HTTP, retries coming back, replayed dead letters. The
// documented NATS permissions let publishers write the public subjects only
// (docs/OPERATIONS.md), so:
//
//   - a message on a public subject is a fresh job and nothing else: its id
//     is its Nats-Msg-Id when that is a valid job id not shaped like the
//     ids the throttler makes (ValidGivenID; else
//     <lane>-<sequence>), its Content-Type is kept when valid, and every
//     Throttler-* header is ignored (no forged attempts, not-before or
//     notify address, no owner); its Throttle-Reply is kept as written, and checked
//     against the lane's results.reply_subjects before anything is
//     published there;
//   - a message on an internal subject is believed, within bounds.

// InternalPrefix starts the subjects on which the throttler stores jobs
// itself.
const InternalPrefix = "throttler.lane"

// InternalSubject is the subject on which the throttler stores a job of
// lane (and key).
func InternalSubject(lane, key string) string {
	if key == "" {
		return InternalPrefix + "." + lane
	}
	return InternalPrefix + "." + lane + "." + key
}

// Bounds of what a stored message may say.
const (
	// MaxJobID is the longest job id (Idempotency-Key, Nats-Msg-Id).
	MaxJobID = 255
	// MaxContentType is the longest Content-Type kept with a job.
	MaxContentType = 1024
	// maxAttempts bounds a believed attempt count.
	maxAttempts = 1_000_000
	// maxNotBefore bounds how far ahead a believed retry or delay time
	// may be: a delayed job's is at most its lane's max_delay.
	maxNotBefore = MaxDelayLimit
	// maxClockAhead bounds how far ahead of this instance's clock a
	// believed first-store time may be (another instance's clock).
	maxClockAhead = time.Minute
)

// ValidJobID reports why id cannot be a job id: empty, longer than
// MaxJobID bytes, or with a byte outside visible ASCII.
func ValidJobID(id string) error {
	if id == "" {
		return fmt.Errorf("the id is empty")
	}
	if len(id) > MaxJobID {
		return fmt.Errorf("the id is %d bytes; at most %d are allowed", len(id), MaxJobID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("the id has a byte 0x%02x at %d; only visible ASCII is allowed", c, i)
		}
	}
	return nil
}

// validContentType keeps a media type of at most MaxContentType bytes of
// visible ASCII and spaces.
func validContentType(ct string) bool {
	if len(ct) > MaxContentType {
		return false
	}
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; c < ' ' || c > '~' {
			return false
		}
	}
	return true
}

// subjectKey splits a stored message's subject into whether the throttler
// wrote it and the job's key. ok is false for a subject of neither form.
func subjectKey(lane, subject string) (internal bool, key string, ok bool) {
	for _, p := range []struct {
		prefix   string
		internal bool
	}{{InternalSubject(lane, ""), true}, {Subject(lane, ""), false}} {
		rest, found := strings.CutPrefix(subject, p.prefix)
		if !found {
			continue
		}
		if rest == "" {
			return p.internal, "", true
		}
		if k, dot := strings.CutPrefix(rest, "."); dot && k != "" {
			return p.internal, k, true
		}
	}
	return false, "", false
}

// decodeJob reads the job a stored message of lane carries; seq is its
// stream sequence and trusted says the subject is the throttler's own (see
// the top of this file). now bounds a believed retry time.
func decodeJob(lane string, h nats.Header, data []byte, key string, seq uint64, trusted bool, now time.Time) Job {
	job := Job{Lane: lane, Key: key, Payload: data, Outside: !trusted}
	if ct := h.Get(HeaderContentType); validContentType(ct) {
		job.ContentType = ct
	}
	job.Trace, job.TraceErr = decodeTrace(h)
	job.Dest = decodeDest(h)
	if trusted {
		job.ID = h.Get(HeaderJobID)
	}
	if ValidJobID(job.ID) != nil {
		job.ID = h.Get(jetstream.MsgIDHeader)
		if !trusted && ValidGivenID(lane, job.ID) != nil {
			// A publisher's id must not be one the throttler makes
			// (SeqID, LaneSeqID): that id names another job.
			job.ID = ""
		}
	}
	if p := h.Get(HeaderIDPrefix); trusted && ValidJobID(job.ID) != nil && ValidIDPrefix(p) == nil {
		job.ID = SeqID(p, seq)
	}
	if ValidJobID(job.ID) != nil {
		job.ID = lane + "-" + strconv.FormatUint(seq, 10)
	}
	if !trusted {
		job.Reply = replyOf(valuesFold(h, records.HeaderReply))
		return job
	}
	job.Reply = replyOf(h.Values(HeaderReplyStored))
	if n := h.Get(HeaderNotifyID); ValidJobID(n) == nil {
		job.NotifyID = n
	}
	job.Notify = notifyAddress(h.Get(HeaderNotify))
	job.Outside = h.Get(HeaderVia) == "nats"
	if o := h.Get(HeaderOwner); !job.Outside && ValidJobID(o) == nil {
		// An owner is a key id: bounded as a job id is.
		job.Owner = o
	}
	job.Wait = records.WaitAddress(h.Get(HeaderWait)) // a wait subject, or nothing
	if cb := h.Get(HeaderCallback); len(cb) <= dest.MaxURL {
		job.Callback = cb
	}
	if rev, err := strconv.ParseUint(h.Get(HeaderRecordRev), 10, 64); err == nil {
		job.RecordRev = rev
	}
	if seq, err := strconv.ParseUint(h.Get(HeaderReplayedFrom), 10, 64); err == nil {
		job.ReplayedFrom = seq
	}
	if n, err := strconv.Atoi(h.Get(HeaderAttempts)); err == nil && n > 0 && n <= maxAttempts {
		job.Attempts = n
	}
	if ms, err := strconv.ParseInt(h.Get(HeaderNotBefore), 10, 64); err == nil && ms > 0 {
		if nb := time.UnixMilli(ms); nb.Sub(now) <= maxNotBefore {
			job.NotBefore = nb
		}
	}
	if ms, err := strconv.ParseInt(h.Get(headerExpiresAt), 10, 64); err == nil && ms > 0 {
		job.Expires = time.UnixMilli(ms)
	}
	if ms, err := strconv.ParseInt(h.Get(HeaderEnqueuedAt), 10, 64); err == nil && ms > 0 {
		if at := time.UnixMilli(ms); !at.After(now.Add(maxClockAhead)) {
			job.EnqueuedAt = at
		}
	}
	return job
}

// valuesFold returns the values of header name in h in any spelling (a
// publisher's client may send it lower-case), all spellings together.
func valuesFold(h nats.Header, name string) []string {
	var out []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			out = append(out, v...)
		}
	}
	return out
}

// UnusableReply is the Job.Reply of a job that sent Throttle-Reply twice or
// over records.MaxReplyLen bytes: a value every check refuses (the job is
// then dead-lettered, never delivered with its answer going nowhere).
const UnusableReply = refused

// replyOf keeps a reply subject within its bound.
func replyOf(v []string) string {
	switch {
	case len(v) == 0:
		return ""
	case len(v) > 1 || len(v[0]) > records.MaxReplyLen:
		return UnusableReply
	}
	return v[0]
}

// republish stores a job the throttler already held (a retry coming back, a
// replayed dead letter) on its lane's internal subject. Its Nats-Msg-Id
// makes a repeat after a crash harmless, but anyone who may publish on the
// lane's public subject can also use that id first: a "duplicate" answer is
// therefore believed only when the stored message it names is this very
// copy (the throttler's subject, same job id and msg id). Otherwise the job
// is stored again under a fresh id: a duplicate answer never drops a job.
func (q *Queue) republish(ctx context.Context, job Job) error {
	ls, err := q.lane(job.Lane)
	if err != nil {
		return err
	}
	ack, err := q.publish(ctx, InternalSubject(job.Lane, job.Key), jobMsg(job))
	if err != nil {
		return fmt.Errorf("lane %s: %w", job.Lane, err)
	}
	if !ack.Duplicate || q.isCopy(ctx, ls, ack.Sequence, job) {
		ls.stored(job.Key)
		return nil
	}
	q.log.Warn("a stored message holds the msg id of a job being stored again; storing it under a fresh id",
		"lane", job.Lane, "id", job.ID, "msg_id", job.MsgID, "seq", ack.Sequence)
	job.MsgID += "#" + nuid.Next()
	if _, err := q.publish(ctx, InternalSubject(job.Lane, job.Key), jobMsg(job)); err != nil {
		return fmt.Errorf("lane %s: %w", job.Lane, err)
	}
	ls.stored(job.Key)
	return nil
}

// isCopy reports whether the stream message at seq is the throttler's own
// copy of job (same internal subject, job id and msg id). A message that is
// gone cannot be shown to be the copy.
func (q *Queue) isCopy(ctx context.Context, ls *laneState, seq uint64, job Job) bool {
	raw, err := ls.stream.GetMsg(ctx, seq)
	if err != nil {
		return false
	}
	return rawIsCopy(raw, job)
}

// rawIsCopy reports whether the stored message raw is the throttler's own
// copy of job (same internal subject, job id and msg id).
func rawIsCopy(raw *jetstream.RawStreamMsg, job Job) bool {
	internal, key, ok := subjectKey(job.Lane, raw.Subject)
	return ok && internal && key == job.Key && raw.Header.Get(HeaderJobID) == job.ID && raw.Header.Get(jetstream.MsgIDHeader) == job.MsgID
}
