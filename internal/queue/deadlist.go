package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/api"
)

// Listing dead letters, a page per request.
//
// A page is one batch direct get (ADR-31) on the dead-letter stream:
// next_by_subj the lane's subject from after+1, batch the page's limit,
// max_bytes deadPageBytes. The server answers with the messages on a
// per-call inbox and ends with a 204 EOB status (a 404 when there is
// none); each message names the one sent before it (Nats-Last-Sequence),
// so an answer with a gap is refused rather than shown as a page. The
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

// statusNoResponders answers a request nobody subscribes to: a stream
// without direct gets.
const statusNoResponders = "503"

// errNoDirect says the dead-letter stream answered no batch direct get.
var errNoDirect = errors.New("no batch direct get")

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

// listDeadDirect reads a page with one batch direct get. It returns
// errNoDirect when the stream answers none (no responders, or a server
// without batch gets), having read nothing.
func (q *Queue) listDeadDirect(ctx context.Context, lane string, after uint64, limit int) (api.DeadLetters, error) {
	var page api.DeadLetters
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, getTimeout)
		defer cancel()
	}
	subject := DeadSubject(lane)
	maxBytes := deadPageBytes
	if q.deadPageBytes > 0 {
		maxBytes = q.deadPageBytes
	}
	body, err := json.Marshal(scanReq{Seq: after + 1, NextBy: subject, Batch: limit, MaxBytes: maxBytes})
	if err != nil {
		return page, err
	}
	unavailable := func(err error) (api.DeadLetters, error) {
		return api.DeadLetters{}, fmt.Errorf("%w: dead letters of %s: %v", ErrUnavailable, lane, err)
	}
	// A per-call inbox, with room for the whole answer (limit messages
	// and the EOB): the client drops nothing of it, and reading it takes
	// no goroutine.
	inbox := q.nc.NewInbox()
	answers := make(chan *nats.Msg, limit+1)
	sub, err := q.nc.ChanSubscribe(inbox, answers)
	if err != nil {
		return unavailable(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := q.nc.PublishRequest("$JS.API.DIRECT.GET."+DeadStream, inbox, body); err != nil {
		return unavailable(err)
	}
	var prev uint64
	for ctx.Err() == nil {
		var m *nats.Msg
		select {
		case m = <-answers:
		case <-ctx.Done():
			return unavailable(ctx.Err())
		}
		if status := m.Header.Get(hdrStatus); status != "" && len(m.Data) == 0 {
			switch status {
			case statusNoResponders:
				if prev == 0 {
					return page, errNoDirect
				}
			case statusEOB:
				if ls, _ := strconv.ParseUint(m.Header.Get(hdrLastSeq), 10, 64); ls != prev {
					return unavailable(fmt.Errorf("the answer ends after %d, not %d: part of it is missing", ls, prev))
				}
				pending, _ := strconv.ParseUint(m.Header.Get(hdrNumPending), 10, 64)
				if n := len(page.Dead); n == limit || (n > 0 && pending > 0) {
					page.NextAfter = page.Dead[n-1].Seq
				}
				return page, nil
			case statusNoMsg:
				if prev == 0 {
					return page, nil
				}
			}
			return unavailable(fmt.Errorf("status %s %s", status, m.Header.Get("Description")))
		}
		if m.Header.Get(hdrNumPending) == "" {
			if prev == 0 {
				q.deadNoBatch.Store(true)
				q.log.Info("the NATS server answers no batch direct get; dead letters are listed one per request")
				return page, errNoDirect
			}
			return unavailable(errors.New("a message without Nats-Num-Pending in a batch answer"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(hdrStreamSeq), 10, 64)
		if err != nil || seq <= prev || seq <= after {
			return unavailable(fmt.Errorf("bad %s header %q after %d", hdrStreamSeq, m.Header.Get(hdrStreamSeq), max(prev, after)))
		}
		if ls, err := strconv.ParseUint(m.Header.Get(hdrLastSeq), 10, 64); err != nil || ls != prev {
			return unavailable(fmt.Errorf("message %d follows %q, not %d: part of the answer is missing", seq, m.Header.Get(hdrLastSeq), prev))
		}
		if got := m.Header.Get(hdrStreamSubj); got != subject {
			return unavailable(fmt.Errorf("message %d on subject %q, not %q", seq, got, subject))
		}
		if len(page.Dead) == limit {
			return unavailable(fmt.Errorf("more than %d messages", limit))
		}
		d := deadFromRaw(&jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Header: m.Header, Data: m.Data})
		d.Payload = nil
		page.Dead = append(page.Dead, d)
		prev = seq
	}
	return unavailable(ctx.Err())
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
