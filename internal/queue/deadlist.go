package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/api"
)

// Listing dead letters, a page per request.
//
// A page is one batch direct get (ADR-31, batchget.go) on the
// dead-letter stream: next_by_subj the lane's subject from after+1, batch
// the page's limit, max_bytes deadPageBytes. The answers come on an inbox
// the listings share (the Queue's deadInbox, made at the first listing);
// one that is not a whole chain of the lane's dead letters, from the
// first message to the EOB, is refused rather than shown as a page. The
// payloads are dropped as the messages are read: a listing shows only
// their size.
//
// max_bytes bounds what one listing reads: the server stops after the
// message that passes it, so a page of large payloads comes back shorter
// than its limit, with NextAfter its last sequence (the EOB says messages
// remain). A dead-letter stream without AllowDirect (made by an older
// version, or changed back by one during an upgrade: no responders) and a
// server that answers no batch (one message without Nats-Num-Pending) are
// read as before, one message get per dead letter. Any replica answers a
// direct get: on a replicated stream a listing may be a moment behind the
// leader (leaderGet reads one dead letter, and a replay's, from it).

// deadPageBytes bounds the payloads, headers and subjects one listing
// reads (the server sends one message more than fits, at most its
// max_payload).
const deadPageBytes = 4 << 20

// ListDeadPage returns up to limit dead letters of lane with a sequence
// above after, oldest first, without payloads. NextAfter is the after of
// the next page when the page is full, or when it was cut short because
// its dead letters passed the bytes one listing reads; 0 when the lane
// has none after the page.
func (q *Queue) ListDeadPage(ctx context.Context, lane string, after uint64, limit int) (api.DeadLetters, error) {
	st, err := q.deadStream()
	if err != nil {
		return api.DeadLetters{}, err
	}
	if limit <= 0 {
		return api.DeadLetters{}, nil
	}
	if st.CachedInfo().Config.AllowDirect && !q.deadNoBatch.Load() {
		page, err := q.listDeadDirect(ctx, lane, after, limit)
		if !errors.Is(err, errNoDirect) {
			return page, err
		}
	}
	dead, err := q.listDeadEach(ctx, lane, after, limit)
	page := api.DeadLetters{Dead: dead}
	if len(dead) == limit {
		page.NextAfter = dead[len(dead)-1].Seq
	}
	return page, err
}

// ListDead is ListDeadPage without the cursor: a page may be shorter than
// limit with more dead letters after it.
func (q *Queue) ListDead(ctx context.Context, lane string, after uint64, limit int) ([]api.DeadLetter, error) {
	page, err := q.ListDeadPage(ctx, lane, after, limit)
	return page.Dead, err
}

// listDeadDirect reads a page with one batch direct get (batchget.go). It
// returns errNoDirect when the stream answers none (no responders, or a
// server without batch gets), having read nothing.
func (q *Queue) listDeadDirect(ctx context.Context, lane string, after uint64, limit int) (api.DeadLetters, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, getTimeout)
		defer cancel()
	}
	maxBytes := deadPageBytes
	if q.deadPageBytes > 0 {
		maxBytes = q.deadPageBytes
	}
	subject := DeadSubject(lane)
	req := scanReq{Seq: after + 1, NextBy: subject, Batch: limit, MaxBytes: maxBytes}
	dead, end, err := batchGet(ctx, &q.deadInbox, q.nc, DeadStream, req, deadParser(subject))
	switch {
	case errors.Is(err, errNoBatch):
		q.deadNoBatch.Store(true)
		q.log.Info("the NATS server answers no batch direct get; dead letters are listed one per request")
		return api.DeadLetters{}, errNoDirect
	case errors.Is(err, errNoDirect):
		return api.DeadLetters{}, err
	case err != nil:
		return api.DeadLetters{}, fmt.Errorf("%w: dead letters of %s: %v", ErrUnavailable, lane, err)
	}
	page := api.DeadLetters{Dead: dead}
	if n := len(dead); n == limit || (n > 0 && end.pending > 0) {
		page.NextAfter = dead[n-1].Seq
	}
	return page, nil
}

// deadParser reads a dead letter of a page (readBatch), without its
// payload: its subject must be the lane's, subject.
func deadParser(subject string) func(seq uint64, m *nats.Msg) (api.DeadLetter, error) {
	return func(seq uint64, m *nats.Msg) (api.DeadLetter, error) {
		if got := m.Header.Get(hdrStreamSubj); got != subject {
			return api.DeadLetter{}, fmt.Errorf("message %d on subject %q, not %q", seq, got, subject)
		}
		d := deadFromRaw(&jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Header: m.Header, Data: m.Data})
		d.Payload = nil
		return d, nil
	}
}

// listDeadEach reads a page one message get per dead letter.
func (q *Queue) listDeadEach(ctx context.Context, lane string, after uint64, limit int) ([]api.DeadLetter, error) {
	var out []api.DeadLetter
	seq := after + 1
	for len(out) < limit {
		raw, err := q.leaderGet(ctx, DeadStream, seq, DeadSubject(lane))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("%w: dead letters of %s: %v", ErrUnavailable, lane, err)
		}
		d := deadFromRaw(raw)
		d.Payload = nil
		out = append(out, d)
		seq = raw.Sequence + 1
	}
	return out, nil
}
