package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// A job stored without an id of its own (no Idempotency-Key) on a lane
// with job records gets SeqID(prefix, seq) as its id: the prefix is the
// storing instance's (IDPrefixLen random characters and a '.'), seq the
// job's place in its lane's stream. Such an id says where the job is, so
// that it is found by its id (Lookup) while it waits, without a record
// written for it at intake.

// IDPrefixLen is the length of an id prefix, its '.' included.
const IDPrefixLen = 12

// SeqID is the id of the job stored at seq with prefix.
func SeqID(prefix string, seq uint64) string { return prefix + strconv.FormatUint(seq, 10) }

// ValidIDPrefix checks an id prefix: IDPrefixLen-1 letters or digits and a
// '.'.
func ValidIDPrefix(p string) error {
	if len(p) != IDPrefixLen || p[IDPrefixLen-1] != '.' {
		return fmt.Errorf("an id prefix is %d letters or digits and a '.'", IDPrefixLen-1)
	}
	for i := 0; i < IDPrefixLen-1; i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return fmt.Errorf("an id prefix has only letters and digits before its '.'")
		}
	}
	return nil
}

// ParseSeqID splits an id made by SeqID; ok is false for any other id.
func ParseSeqID(id string) (prefix string, seq uint64, ok bool) {
	if len(id) <= IDPrefixLen || ValidIDPrefix(id[:IDPrefixLen]) != nil || strings.HasPrefix(id[IDPrefixLen:], "0") {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(id[IDPrefixLen:], 10, 64)
	if err != nil || seq == 0 {
		return "", 0, false
	}
	return id[:IDPrefixLen], seq, true
}

// LaneSeqID splits "<lane>-<seq>", the id of a job published on lane
// without a Nats-Msg-Id (seq a positive number without leading zeros); ok
// is false for any other id.
func LaneSeqID(lane, id string) (seq uint64, ok bool) {
	s, found := strings.CutPrefix(id, lane+"-")
	if !found || s == "" || s[0] == '0' {
		return 0, false
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	return seq, err == nil
}

// ValidGivenID checks an id a caller chooses for a job of lane (an
// Idempotency-Key, a Nats-Msg-Id): a valid job id, and not shaped like the
// ids the throttler makes for jobs without one, SeqID's and LaneSeqID's,
// which name another caller's job.
func ValidGivenID(lane, id string) error {
	if err := ValidJobID(id); err != nil {
		return err
	}
	if _, _, ok := ParseSeqID(id); ok {
		return fmt.Errorf("%q has the shape of the ids the throttler makes for jobs without one (%d letters or digits, '.', a number); choose another", id, IDPrefixLen-1)
	}
	if _, ok := LaneSeqID(lane, id); ok {
		return fmt.Errorf("%q has the shape of the ids the throttler gives jobs published on lane %s without a Nats-Msg-Id (%s-<number>); choose another", id, lane, lane)
	}
	return nil
}

// ErrNoSuchJob: the lane's stream holds no waiting job with that id.
var ErrNoSuchJob = errors.New("queue: no such job waiting")

// Lookup finds a job that has no record still stored in its lane's
// stream (waiting, or started and not settled), and when it was stored: a
// job with a SeqID id, or one published over NATS (lookupPublished). A job
// it does not find is ErrNoSuchJob.
func (q *Queue) Lookup(ctx context.Context, lane, id string) (Job, time.Time, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return Job{}, time.Time{}, err
	}
	prefix, seq, ok := ParseSeqID(id)
	if !ok {
		return q.lookupPublished(ctx, ls, id)
	}
	raw, err := ls.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Job{}, time.Time{}, ErrNoSuchJob
	case err != nil:
		return Job{}, time.Time{}, fmt.Errorf("%w: get %s/%d: %v", ErrUnavailable, lane, seq, err)
	}
	internal, key, ok := subjectKey(lane, raw.Subject)
	if !ok || !internal || raw.Header.Get(HeaderIDPrefix) != prefix {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	job := decodeJob(lane, raw.Header, raw.Data, key, seq, true, time.Now())
	if job.ID != id {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	return job, raw.Time, nil
}

// JobAt reads the job stored at seq of lane's stream, where JetStream
// keeps a duplicate's first copy (PubResult.Seq of a duplicate): the job
// as the drain would read it, its owner and whether it came from outside
// included. A job gone from the stream is ErrNoSuchJob.
func (q *Queue) JobAt(ctx context.Context, lane string, seq uint64) (Job, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return Job{}, err
	}
	raw, err := ls.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Job{}, ErrNoSuchJob
	case err != nil:
		return Job{}, fmt.Errorf("%w: get %s/%d: %v", ErrUnavailable, lane, seq, err)
	}
	internal, key, ok := subjectKey(lane, raw.Subject)
	if !ok {
		return Job{}, ErrNoSuchJob
	}
	return decodeJob(lane, raw.Header, raw.Data, key, seq, internal, time.Now()), nil
}

// lookupPublished finds a job published on lane's public subject (over
// NATS) that no drain has claimed yet: its id is "<lane>-<seq>" (published
// without a Nats-Msg-Id) or its Nats-Msg-Id. JetStream keeps no index of
// its messages by header, only the stream's de-duplication window, so a
// Nats-Msg-Id is found while the window still holds it (the lane's
// nats.dedup_window after its publish): probeMsgID asks the stream where
// it stored that msg id. A keyed lane's job is looked for in its intake
// stream, then, moved, in its lane stream under the move's msg id.
func (q *Queue) lookupPublished(ctx context.Context, ls *laneState, id string) (Job, time.Time, error) {
	lane := ls.spec.Name
	from := ls.stream
	if ls.in != nil {
		from = ls.in
	}
	if seq, ok := LaneSeqID(lane, id); ok {
		// No Nats-Msg-Id names a job with an id of this form.
		return q.publishedAt(ctx, ls, from, id, seq)
	}
	seq, found, err := q.probeMsgID(ctx, from, Subject(lane, ""), id)
	switch {
	case err != nil:
		return Job{}, time.Time{}, err
	case !found:
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	return q.publishedAt(ctx, ls, from, id, seq)
}

// publishedAt reads the public job id at seq of from (the lane stream, or
// a keyed lane's intake stream).
func (q *Queue) publishedAt(ctx context.Context, ls *laneState, from jetstream.Stream, id string, seq uint64) (Job, time.Time, error) {
	lane := ls.spec.Name
	raw, err := from.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound) && ls.in != nil:
		return q.lookupMoved(ctx, ls, id, seq)
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Job{}, time.Time{}, ErrNoSuchJob
	case err != nil:
		return Job{}, time.Time{}, fmt.Errorf("%w: get %s/%d: %v", ErrUnavailable, lane, seq, err)
	}
	internal, key, ok := subjectKey(lane, raw.Subject)
	if !ok || internal {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	job := decodeJob(lane, raw.Header, raw.Data, key, seq, false, time.Now())
	if job.ID != id {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	return job, raw.Time, nil
}

// lookupMoved finds the copy of a keyed lane's public job, published at
// intakeSeq of the intake stream, that the intake mover stored in the lane
// stream: under its id when its publisher gave it, else (and for a delayed
// job come due) under the move's own msg id (intakein.go).
func (q *Queue) lookupMoved(ctx context.Context, ls *laneState, id string, intakeSeq uint64) (Job, time.Time, error) {
	if givenID(ls.spec.Name, id) {
		job, at, err := q.movedUnder(ctx, ls, id, id)
		if !errors.Is(err, ErrNoSuchJob) {
			return job, at, err
		}
	}
	return q.movedUnder(ctx, ls, id, intakeSeqMsgID(id, ls.inEpoch, intakeSeq))
}

// movedUnder reads the public job id that the intake mover stored in the
// lane stream under msgID.
func (q *Queue) movedUnder(ctx context.Context, ls *laneState, id, msgID string) (Job, time.Time, error) {
	lane := ls.spec.Name
	seq, found, err := q.probeMsgID(ctx, ls.stream, InternalSubject(lane, ""), msgID)
	switch {
	case err != nil:
		return Job{}, time.Time{}, err
	case !found:
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	raw, err := ls.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Job{}, time.Time{}, ErrNoSuchJob
	case err != nil:
		return Job{}, time.Time{}, fmt.Errorf("%w: get %s/%d: %v", ErrUnavailable, lane, seq, err)
	}
	internal, key, ok := subjectKey(lane, raw.Subject)
	if !ok || !internal {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	job := decodeJob(lane, raw.Header, raw.Data, key, seq, true, time.Now())
	if job.ID != id || !job.Outside {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	at := raw.Time
	if !job.EnqueuedAt.IsZero() {
		at = job.EnqueuedAt
	}
	return job, at, nil
}

// probeMsgID asks st, which takes subject, at which sequence it stored
// msgID, while its de-duplication window holds it. The probe is a publish
// that stores nothing: it names the msg id and an expectation no stream
// meets, which nats-server checks after the msg id. Which one depends on
// how the stream stores:
//
//   - a stream without replicas checks the msg id before an expected last
//     msg id (and an expected last sequence before the msg id): the probe
//     expects a last msg id no message has;
//   - a replicated stream's leader checks the msg id, then an expected last
//     sequence, before it proposes the write to its peers (an expected
//     last msg id it checks only when it applies the write, and a probe
//     refused there left the stream answering no publish): the probe
//     expects a last sequence no stream reaches.
//
// A duplicate answers the stored sequence; the expectation's refusal says
// the stream does not remember the id. The stream's replicas are read
// each time: the probe that suits one kind must never reach the other.
func (q *Queue) probeMsgID(ctx context.Context, st jetstream.Stream, subject, msgID string) (uint64, bool, error) {
	if !q.nc.IsConnected() {
		return 0, false, fmt.Errorf("%w: not connected to NATS (%v)", ErrUnavailable, q.nc.Status())
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, publishTimeout)
		defer cancel()
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("%w: lookup of %q: stream info: %v", ErrUnavailable, msgID, err)
	}
	// A space: no job id, and so no stored msg id, holds one alone
	// after "lookup" (an intake move's holds its job id first).
	expect, refused := jetstream.WithExpectLastMsgID("lookup "+nuid.Next()), codeWrongLastMsgID
	if info.Config.Replicas > 1 || (info.Cluster != nil && info.Cluster.RaftGroup != "") {
		expect, refused = jetstream.WithExpectLastSequence(math.MaxInt64), codeWrongLastSeq
	}
	m := nats.NewMsg(subject)
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	m.Header.Set(jetstream.ExpectedStreamHeader, info.Config.Name)
	ack, err := q.js.PublishMsg(ctx, m, expect)
	var apiErr *jetstream.APIError
	switch {
	case err == nil && ack.Duplicate && ack.Sequence > 0:
		return ack.Sequence, true, nil
	case err == nil:
		// Stored: the stream met the expectation. It cannot, but if it
		// did, the empty job must not stay.
		_ = st.DeleteMsg(ctx, ack.Sequence)
		return 0, false, fmt.Errorf("%w: a lookup of %q was stored on %s", ErrUnavailable, msgID, subject)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == refused:
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("%w: lookup of %q on %s: %v", ErrUnavailable, msgID, subject, err)
}

// JetStream's refusals of the probe's expectations.
const (
	codeWrongLastMsgID jetstream.ErrorCode = 10070 // JSStreamWrongLastMsgIDErr
	codeWrongLastSeq   jetstream.ErrorCode = 10071 // JSStreamWrongLastSequenceErr
)
