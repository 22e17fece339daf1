package lane

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/jsonenc"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// Records keeps the job records of the lanes with results (records.Store):
// the drain claims a job's record before its attempt, writes the attempt's
// end after it, and tells a waiting caller of a settled job.
type Records interface {
	EnsureLane(ctx context.Context, spec records.LaneSpec) error
	Start(ctx context.Context, a records.Attempt) (records.Claim, error)
	Finish(ctx context.Context, c records.Claim, fn func(rec *api.JobRecord)) (api.JobRecord, error)
	// Settled hands a settled record to the caller waiting at address
	// (records.WaitAddress), on whichever instance it waits.
	Settled(address string, rec api.JobRecord)
}

var _ Records = (*records.Store)(nil)

// ensureRecords creates the lane's records bucket when the lane keeps
// results.
func (l *Lane) ensureRecords(ctx context.Context) error {
	r := l.cfg.Results
	if r == nil || l.d.Records == nil {
		return nil
	}
	var urls *dest.Prefixes
	if len(r.CallbackURLs) > 0 {
		var err error
		if urls, err = dest.NewPrefixes(r.CallbackURLs); err != nil {
			return fmt.Errorf("results.callback_urls: %w", err)
		}
	}
	return l.d.Records.EnsureLane(ctx, records.LaneSpec{Name: l.cfg.Name, Keep: r.Keep.D(),
		MaxRecord: int32(r.MaxRecord()), Replicas: l.d.Replicas, CallbackLane: r.CallbackLane, CallbackURLs: urls, Replies: l.replies})
}

// reasonReplyRefused is the dead-letter reason of a job whose
// Throttle-Reply the lane does not allow.
const reasonReplyRefused = "reply subject refused"

// lanesReplies are the reply subjects cfg's jobs may name: under its
// results.reply_subjects, outside every worker's inbox (Deps.Workers).
func lanesReplies(cfg config.Lane, d Deps) (*records.Replies, error) {
	if cfg.Results == nil || len(cfg.Results.ReplySubjects) == 0 {
		return nil, nil
	}
	r, err := records.NewReplies(records.ReplyRules{Prefixes: cfg.Results.ReplySubjects, Workers: d.Workers})
	if err != nil {
		return nil, fmt.Errorf("results.reply_subjects: %w", err)
	}
	return r, nil
}

// checkReply checks the reply subject a job names, if any; a refusal is
// logged with the job and the reason (never the job's payload).
func (l *Lane) checkReply(job queue.Job) error {
	if job.Reply == "" {
		return nil
	}
	err := l.replies.Check(job.Reply)
	if job.Reply == queue.UnusableReply {
		err = &records.ReplyError{Msg: fmt.Sprintf("%s was sent twice, or is over %d bytes", records.HeaderReply, records.MaxReplyLen)}
	}
	if err != nil {
		l.log.Warn("job names a reply subject the lane refuses; dead-lettered", "id", job.ID, "err", err)
	}
	return err
}

// keepsRecords reports whether the lane keeps job records.
func (l *Lane) keepsRecords() bool { return l.cfg.Results != nil && l.d.Records != nil }

// claim claims msg's record for the attempt about to start. ok is false
// when the job must not start: it was cancelled or expired (then it has
// been acked and is gone), or the record could not be read (then it waits
// in place and comes again). A job whose id has another caller's record
// (records.ErrOtherOwner) starts with the empty Claim: no record is
// written for it.
//
// replyOK says the job's reply subject passed the lane's check: only then
// is it kept in the record.
func (l *Lane) claim(dctx context.Context, msg *queue.Msg, replyOK bool) (records.Claim, bool) {
	job := msg.Job()
	reply := job.Reply
	if !replyOK {
		reply = ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(dctx), settleTimeout)
	defer cancel()
	c, err := l.d.Records.Start(ctx, records.Attempt{Lane: l.cfg.Name, ID: job.ID, Key: job.Key, Hint: job.RecordRev,
		Fresh: job.RecordRev == 0 && job.Attempts == 0 && msg.FirstDelivery(), Stored: msg.EnqueuedAt(), Now: l.d.Clock.Now(), Callback: job.Callback, Reply: reply, Owner: job.Owner,
		ReplayedFrom: job.ReplayedFrom})
	switch {
	case err == nil:
		l.recWrites.claimOK.Inc()
		return c, true
	case errors.Is(err, records.ErrOtherOwner):
		l.recWrites.claimOtherOwner.Inc()
		// Another caller made a record under this job's id: the job is
		// delivered without one (record writes nothing for the empty
		// claim), and that record keeps its own state.
		l.log.Warn("job's id has another caller's record; delivered without a record", "id", job.ID)
		return records.Claim{}, true
	case errors.Is(err, records.ErrNotStartable):
		l.recWrites.claimNotStartable.Inc()
		l.log.Info("job cancelled or expired before it started; not delivered", "id", job.ID)
		if err := msg.AckSync(ctx); err != nil {
			l.log.Warn("ack of a cancelled job failed; it comes again and is dropped again", "id", job.ID, "err", err)
		}
		l.settledKeyed(dctx, msg)
		return records.Claim{}, false
	default:
		// Whether the job was cancelled is unknown: it must not start.
		l.recWrites.claimError.Inc()
		l.log.Warn("job record unavailable; the job waits and comes again", "id", job.ID, "err", err)
		_ = msg.Wait(time.Second)
		return records.Claim{}, false
	}
}

// record writes the end of an attempt into the claimed record, then tells
// the waiting caller of a settled job. A failure is logged: the job's
// delivery stands whatever its record says.
func (l *Lane) record(dctx context.Context, msg *queue.Msg, c records.Claim, res dispatch.Result, act Action) {
	if c.Rev == 0 {
		return // claimed without a record (records.ErrOtherOwner)
	}
	now := l.d.Clock.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(dctx), settleTimeout)
	defer cancel()
	rec, err := l.d.Records.Finish(ctx, c, func(rec *api.JobRecord) {
		if act.Kind != Release && act.Reason != reasonReplyRefused {
			rec.Attempts = append(rec.Attempts, attemptOf(now, res))
		}
		switch act.Kind {
		case Ack:
			rec.State = api.StateDelivered
		case Dead:
			rec.State, rec.Reason = api.StateDead, act.Reason
		case Retry, Wait:
			rec.State = api.StateRetrying
		case Release:
			rec.State = api.StateQueued
		}
		if rec.State.Settled() {
			rec.FinishedAt = &now
			rec.Response = responseOf(res.Response)
		}
	})
	if err != nil {
		l.recWrites.endError.Inc()
		l.log.Warn("writing the job's record failed", "id", msg.Job().ID, "err", err)
		return
	}
	l.recWrites.endOK.Inc()
	if w := msg.Job().Wait; w != "" && rec.State.Settled() {
		l.d.Records.Settled(w, rec)
	}
}

// attemptOf is one attempt as a record keeps it.
func attemptOf(at time.Time, res dispatch.Result) api.JobAttempt {
	a := api.JobAttempt{At: at.Add(-res.Took).UTC(), Status: res.Status, DurationMillis: float64(res.Took.Microseconds()) / 1000}
	if res.Status == 0 && res.Err != nil {
		a.Error = errorClass(res.Err)
	}
	return a
}

// errorClass classifies an attempt that got no answer.
func errorClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, dispatch.ErrForbiddenAddress):
		return "forbidden_address"
	case errors.Is(err, dispatch.ErrRedirected):
		return "redirected"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &ne):
		return "connection"
	}
	return "error"
}

// responseOf is the kept answer as a record holds it.
func responseOf(r *dispatch.Response) *api.JobResponse {
	if r == nil {
		return nil
	}
	out := &api.JobResponse{Status: r.Status, Truncated: r.Truncated}
	if len(r.Header) > 0 {
		out.Headers = keptHeaders(r.Header)
	}
	// A record holds at most twice max_body of answer
	// (config.Results.MaxRecord): a body that JSON escapes longer (<, >,
	// & and control characters take six bytes each) goes as base64, or
	// the bucket would refuse the settling write.
	if s := string(r.Body); utf8.ValidString(s) && jsonenc.StringLen(s) <= 2*len(s)+2 {
		out.Body = s
	} else {
		out.BodyBase64 = base64.StdEncoding.EncodeToString(r.Body)
	}
	return out
}

// maxKeptHeaders bounds the headers a record keeps, JSON-escaped: an
// answer's headers take up to 64KiB raw, six times that once escaped (<,
// >, & and control characters), and a record has room for twice
// results.max_body and 64KiB in all (config.Results.MaxRecord).
const maxKeptHeaders = 16 << 10

// keptHeaders is h when it fits maxKeptHeaders, else Content-Type and
// then the other headers by name, each while it fits.
func keptHeaders(h map[string]string) map[string]string {
	size := func(k, v string) int { return jsonenc.StringLen(k) + jsonenc.StringLen(v) + 2 }
	n := 0
	for k, v := range h {
		n += size(k, v)
	}
	if n <= maxKeptHeaders {
		return h
	}
	out := make(map[string]string, len(h))
	n = 0
	names := slices.Sorted(maps.Keys(h))
	if i := slices.Index(names, "Content-Type"); i > 0 {
		names = append(append([]string{"Content-Type"}, names[:i]...), names[i+1:]...)
	}
	for _, k := range names {
		if m := size(k, h[k]); n+m <= maxKeptHeaders {
			out[k], n = h[k], n+m
		}
	}
	return out
}
