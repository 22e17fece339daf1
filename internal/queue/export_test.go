package queue

import (
	"context"

	"github.com/throttler/throttler/api"
)

// ListDeadEach lists dead letters one message get per dead letter, as a
// listing on a stream without direct gets does.
func ListDeadEach(ctx context.Context, q *Queue, lane string, after uint64, limit int) ([]api.DeadLetter, error) {
	if _, err := q.deadStream(); err != nil {
		return nil, err
	}
	return q.listDeadEach(ctx, lane, after, limit)
}

// SetDeadPageBytes bounds the bytes one of q's listings reads; 0 restores
// the default.
func SetDeadPageBytes(q *Queue, n int) { q.deadPageBytes = n }

// DeadListingsWaiting counts the listings of q that wait for an answer on
// the inbox they share.
func DeadListingsWaiting(q *Queue) int {
	q.deadInbox.mu.Lock()
	defer q.deadInbox.mu.Unlock()
	return len(q.deadInbox.calls)
}

// HeaderExpiresAt is the dead letter's header of the job's expiry.
const HeaderExpiresAt = headerExpiresAt

// OnStreamRead makes the next stream info read of the backlog estimate run
// f between JetStream's answer and its use, once; undo takes it back.
func OnStreamRead(f func()) (undo func()) {
	testHookStreamRead = func() {
		testHookStreamRead = nil
		f()
	}
	return func() { testHookStreamRead = nil }
}

// OnMoved makes the keyed intake's mover call f after each confirmed move,
// before the original is deleted; f returning true stops the mover there, as
// if its instance died. Set it only while no mover runs; undo takes it back.
func OnMoved(f func(seq uint64) bool) (undo func()) {
	testHookMoved = f
	return func() { testHookMoved = nil }
}

// RetryMsgID is the Nats-Msg-Id of m's retry copy.
func RetryMsgID(m *Msg) string { return m.retryMsgID() }

// DeadMsgID is the Nats-Msg-Id of m's dead letter.
func DeadMsgID(m *Msg) string { return m.deadMsgID() }

// OnDelete runs f before each settled keyed job's delete is sent.
func OnDelete(f func(seq uint64)) (undo func()) {
	testHookDelete = f
	return func() { testHookDelete = nil }
}

// AheadScans counts the requests r read the lane ahead with.
func AheadScans(r *KeyedReader) uint64 { return r.ahead.scans.Load() }

// SetScanBatch makes r ask n messages per read ahead; 0 asks a plain
// direct get, which the server answers with one message and no batch
// headers (as a server without batch gets does).
func SetScanBatch(r *KeyedReader, n int) { r.scanBatch = n }

// AgeAhead makes what r read ahead as old as it may ever be trusted.
func AgeAhead(r *KeyedReader) {
	r.ahead.mu.Lock()
	r.ahead.born = r.ahead.born.Add(-aheadFor)
	r.ahead.mu.Unlock()
}

// TriesReads counts the reads of c's tries bucket.
func TriesReads(c *Consumer) uint64 { return c.tries.reads.Load() }

// StoreScheduled stores job's delayed copy in the retry stream under
// job.MsgID, as Schedule and the keyed intake's mover do.
func StoreScheduled(ctx context.Context, q *Queue, job Job) (PubResult, error) {
	ack, err := q.storeScheduled(ctx, job)
	if err != nil {
		return PubResult{}, err
	}
	return PubResult{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// ClaimID claims job's id in its lane after its delayed copy was stored
// (stored: that store's answer), as Schedule and the keyed intake's mover
// do.
func ClaimID(ctx context.Context, q *Queue, job Job, stored PubResult) (PubResult, error) {
	ls, err := q.lane(job.Lane)
	if err != nil {
		return PubResult{}, err
	}
	return q.claimID(ctx, ls, job, stored)
}

// IntakeMoveMsgID is the msg id the keyed intake's mover gives the job id
// it read at seq of lane's intake stream when the id is the throttler's or
// the job is delayed.
func IntakeMoveMsgID(q *Queue, lane, id string, seq uint64) string {
	ls, err := q.lane(lane)
	if err != nil {
		return ""
	}
	return intakeSeqMsgID(id, ls.inEpoch, seq)
}

// ScheduledMsgID is the msg id of the delayed copy of job id of lane
// submitted over HTTP.
func ScheduledMsgID(lane, id string) string { return scheduledMsgID(lane, id) }
