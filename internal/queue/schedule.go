package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Delay and expiry.
//
// A job submitted with a delay (Throttle-Delay, Throttle-Not-Before) is
// stored at once, but not in its lane: it waits in the retry stream
// (retry.go), as a failed job waits for its next attempt, with its
// Not-Before time. The lane's retry mover, which every instance runs on
// one shared durable consumer, puts it at the tail of its lane when it is
// due, under a msg id of its own, so a move repeated after a crash is
// dropped as a duplicate: each delayed job enters its lane once, whichever
// instance moves it, and it outlives restarts of the instances and of
// NATS (file storage). From there it waits for its slot like any job: the
// delay never changes the lane's pacing.
//
// nats-server (2.12 on) can schedule a message itself (Nats-Schedule), but
// the scheduled message and its target subject must be in one stream: the
// lane stream would hold the schedules, counted against max_backlog, with
// its drain consumer filtered around them. The retry stream already holds
// jobs waiting for a time, outside the lane's max_inflight.
//
// A job's expiry (Throttle-Expires, or its lane's max_age counted from when
// the job entered the lane) is a bound on its first start: a job not
// started by then is dead-lettered with the reason "expired" and never
// delivered. It is checked where a job could start: when a delayed job is
// due (or expires first), when a drain fetches it, and by the drain right
// before the delivery, on the goroutine that holds the job, so that the
// check and the start are ordered. A job that started once (a retry) no
// longer expires.

// Headers of a job published on a lane's public subject, and of a
// submission over HTTP: the publisher's own request for its job.
const (
	HeaderThrottleDelay     = "Throttle-Delay"
	HeaderThrottleNotBefore = "Throttle-Not-Before"
	HeaderThrottleExpires   = "Throttle-Expires"
)

// headerExpiresAt holds a stored job's expiry in Unix ms. Set only by the
// throttler (on its internal subjects and the retry stream).
const headerExpiresAt = "Throttler-Expires"

// ReasonExpired is the dead-letter reason of a job not started by its
// expiry.
const ReasonExpired = "expired"

// MaxDelayLimit bounds a lane's max_delay, and how far ahead a stored
// not-before time is believed.
const MaxDelayLimit = 366 * 24 * time.Hour

// DefaultMaxDelay is a lane's max_delay when its config gives none.
const DefaultMaxDelay = 30 * 24 * time.Hour

// maxScheduleValue bounds the length of one schedule header's value.
const maxScheduleValue = 64

// When is what a submission asks of a job's start: the raw values of
// Throttle-Delay, Throttle-Not-Before and Throttle-Expires (or of a batch
// item's delay, not_before and expires); empty for none.
type When struct {
	Delay, NotBefore, Expires string
}

// IsZero reports that no schedule was asked for.
func (w When) IsZero() bool { return w == When{} }

// Schedule is a job's start window: it enters its lane no earlier than
// NotBefore (zero: at once), and is dead-lettered if not started by Expires
// (zero: never).
type Schedule struct {
	NotBefore time.Time
	Expires   time.Time
}

// ScheduleError says which of a When's values is wrong, and why.
type ScheduleError struct {
	// Field is "delay", "not_before" or "expires".
	Field string
	Msg   string
}

func (e *ScheduleError) Error() string { return e.Field + ": " + e.Msg }

// ErrBadSchedule: a delay, not-before or expiry that cannot be used. A
// *ScheduleError matches it.
var ErrBadSchedule = errors.New("queue: invalid schedule")

// Is makes a *ScheduleError match ErrBadSchedule.
func (e *ScheduleError) Is(target error) bool { return target == ErrBadSchedule }

// Header names the header a ScheduleError's field comes from.
func (e *ScheduleError) Header() string {
	switch e.Field {
	case "delay":
		return HeaderThrottleDelay
	case "not_before":
		return HeaderThrottleNotBefore
	}
	return HeaderThrottleExpires
}

// ParseSchedule reads w at now, for a lane whose max_delay is maxDelay: a
// delay is a Go duration ("90s", "1h30m") or whole seconds ("90"); a
// not-before and an expiry are RFC 3339 times. A not-before in the past is
// now. It refuses a negative delay or one over maxDelay (a not-before
// likewise), both a delay and a not-before, and an expiry not after now.
// An expiry before the not-before is taken: the job expires while it
// waits, and is dead-lettered then, never delivered.
func ParseSchedule(w When, now time.Time, maxDelay time.Duration) (Schedule, error) {
	var s Schedule
	bad := func(field, format string, args ...any) (Schedule, error) {
		return Schedule{}, &ScheduleError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if w.Delay != "" && w.NotBefore != "" {
		return bad("not_before", "give a delay or a not-before time, not both")
	}
	for _, f := range []struct{ name, v string }{{"delay", w.Delay}, {"not_before", w.NotBefore}, {"expires", w.Expires}} {
		if len(f.v) > maxScheduleValue {
			return bad(f.name, "is %d bytes; at most %d are allowed", len(f.v), maxScheduleValue)
		}
	}
	if w.Delay != "" {
		d, err := parseDelay(w.Delay)
		if err != nil {
			return bad("delay", "%q is not a duration like 90s or 1h30m, or a whole number of seconds", w.Delay)
		}
		if d < 0 {
			return bad("delay", "%q is negative", w.Delay)
		}
		if d > maxDelay {
			return bad("delay", "%v is longer than the lane's max_delay of %v", d, maxDelay)
		}
		if d > 0 {
			s.NotBefore = now.Add(d)
		}
	}
	if w.NotBefore != "" {
		t, err := time.Parse(time.RFC3339Nano, w.NotBefore)
		if err != nil {
			return bad("not_before", "%q is not an RFC 3339 time like 2026-01-02T15:04:05Z", w.NotBefore)
		}
		if d := t.Sub(now); d > maxDelay {
			return bad("not_before", "is %v ahead, more than the lane's max_delay of %v", d.Round(time.Second), maxDelay)
		}
		if t.After(now) {
			s.NotBefore = t
		}
	}
	if w.Expires != "" {
		t, err := time.Parse(time.RFC3339Nano, w.Expires)
		if err != nil {
			return bad("expires", "%q is not an RFC 3339 time like 2026-01-02T15:04:05Z", w.Expires)
		}
		if !t.After(now) {
			return bad("expires", "%s is not in the future", w.Expires)
		}
		s.Expires = t
	}
	return s, nil
}

// parseDelay reads a Go duration or a whole number of seconds.
func parseDelay(v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n > int64(MaxDelayLimit/time.Second) || n < -int64(MaxDelayLimit/time.Second) {
			return 0, errors.New("out of range")
		}
		return time.Duration(n) * time.Second, nil
	}
	if strings.TrimLeft(v, "+-0123456789.") == "" {
		return 0, errors.New("a number without a unit")
	}
	return time.ParseDuration(v)
}

// publicWhen reads the schedule headers of a job published on a public
// subject.
func publicWhen(h nats.Header) When {
	return When{Delay: h.Get(HeaderThrottleDelay), NotBefore: h.Get(HeaderThrottleNotBefore), Expires: h.Get(HeaderThrottleExpires)}
}

// applyPublicSchedule reads the schedule a publisher asked for in a public
// job's headers, counted from storedAt (the server's time of the store),
// into job; a bad one is kept in job.ScheduleErr (the job is poison).
func applyPublicSchedule(job *Job, h nats.Header, storedAt time.Time, maxDelay time.Duration) {
	w := publicWhen(h)
	if w.IsZero() {
		return
	}
	s, err := ParseSchedule(w, storedAt, laneMaxDelay(maxDelay))
	if err != nil {
		job.ScheduleErr = err
		return
	}
	job.NotBefore, job.Expires = s.NotBefore, s.Expires
}

func laneMaxDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultMaxDelay
	}
	return min(d, MaxDelayLimit)
}

// ScheduleHook hears the moments of a delayed or expiring job, for the
// job records that keep its states. Its methods are called after the
// job's own store, on the goroutine that made it, and must be bounded (one
// write at most); they may be called from any instance's goroutines, and
// a moment may be heard twice (at least once) after a crash.
type ScheduleHook interface {
	// Scheduled: the job is stored and waits until due.
	// reply is its reply subject (Job.Reply, unchecked), empty for none.
	Scheduled(lane, id string, due time.Time, reply string)
	// Entered: a delayed job entered its lane's queue.
	Entered(lane, id string)
	// Expired: the job was dead-lettered, not started by its expiry;
	// reply is its reply subject (Job.Reply, unchecked), empty for none.
	Expired(lane, id, reply string)
}

// scheduleHook holds a Queue's ScheduleHook.
type scheduleHook struct{ h atomic.Pointer[ScheduleHook] }

func (s *scheduleHook) get() ScheduleHook {
	if p := s.h.Load(); p != nil {
		return *p
	}
	return nil
}

// SetScheduleHook makes h hear the moments of the queue's delayed and
// expiring jobs; nil hears none. Set it before the lanes run.
func (q *Queue) SetScheduleHook(h ScheduleHook) {
	if h == nil {
		q.hook.h.Store(nil)
		return
	}
	q.hook.h.Store(&h)
}

// Schedule stores job, whose NotBefore is set, to enter its lane when due:
// a copy waits in the retry stream until the lane's retry mover puts it at
// the tail of the lane. Its msg id is the job id's within the retry
// stream's de-duplication window: a resubmission with the same id stores
// nothing new (Duplicate).
//
// With job.ClaimID, the id is also claimed in the lane's stream (claimID):
// an id stored there first, by a job without a delay, makes this one a
// duplicate of it (Duplicate and Queued, Seq its place in the lane), and a
// job without a delay submitted after it is a duplicate of this one.
func (q *Queue) Schedule(ctx context.Context, job Job) (PubResult, error) {
	ls, err := q.lane(job.Lane)
	if err != nil {
		return PubResult{}, err
	}
	if job.NotBefore.IsZero() {
		return PubResult{}, fmt.Errorf("queue: schedule %s: no not-before time", job.ID)
	}
	job.MsgID = scheduledMsgID(job.Lane, job.ID)
	copied := job
	if job.ClaimID {
		// The copy may not be moved into the lane before the claim
		// said whether the id's job is there already (it is then taken
		// out again): a job due at once waits claimGuard.
		copied.NotBefore = later(job.NotBefore, time.Now().Add(claimGuard))
	}
	ack, err := q.storeScheduled(ctx, copied)
	if err != nil {
		return PubResult{}, err
	}
	res := PubResult{Seq: ack.Sequence, Duplicate: ack.Duplicate}
	if job.ClaimID {
		if res, err = q.claimID(ctx, ls, job, res); err != nil {
			return PubResult{}, err
		}
	}
	if !res.Duplicate {
		if h := q.hook.get(); h != nil {
			h.Scheduled(job.Lane, job.ID, job.NotBefore, job.Reply)
		}
	}
	return res, nil
}

// claimGuard is the least time a delayed job whose id is claimed
// (Job.ClaimID) waits in the retry stream: longer than its claim and the
// delete of a duplicate's copy take, so that the retry mover never moves a
// copy the claim is about to take out. A claim slower than that is
// handled by claimID too (takeBackMoved).
const claimGuard = time.Second

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// headerClaim marks a claim of a delayed job's id in its lane's stream
// (claimID): a message with no job, on the lane's internal subject
// without a key. Set only by the throttler; a drain that fetches one acks
// it and starts nothing.
const headerClaim = "Throttler-Claim"

// claimID claims the id of job, a delayed job whose copy is stored in the
// retry stream (stored: that store's answer), in its lane's stream, where
// a job of that id submitted without a delay is stored: a message with no
// job under the id as its msg id, deleted at once. JetStream remembers the
// id for the lane's de-duplication window after the message is gone, so
// the lane's stream de-duplicates a job id whichever way it came:
//
//   - the claim is new: no job of the id was stored in the lane within the
//     window, and one submitted after it without a delay is a duplicate;
//   - the claim is a duplicate and the copy was new: a job of the id was
//     stored in the lane first, without a delay. The copy is deleted (the
//     retry stream still remembers its msg id, so a delayed resubmission
//     stays a duplicate too) and the answer is that job's (Queued);
//   - the copy was a duplicate: a resubmission. A claim stored now stands
//     in for one the first store did not make; a duplicate claim naming a
//     job the lane still holds (not a claim) makes the answer that job's
//     (Queued), as the first delayed duplicate of it was answered, and
//     takes the copy out if it is still there (its first delete failed).
//
// The copy waits at least claimGuard, so that the retry mover does not
// move it into the lane before the claim is answered.
//
// A claim that cannot be stored (the lane at its max_backlog, NATS away)
// leaves the delayed job stored without it, as it was stored before
// claims: its answer is its store's, and the miss is logged. A copy that
// cannot be deleted is an error: the job may be stored twice.
func (q *Queue) claimID(ctx context.Context, ls *laneState, job Job, stored PubResult) (PubResult, error) {
	subject := InternalSubject(job.Lane, "")
	claim := &nats.Msg{Subject: subject, Header: nats.Header{
		jetstream.MsgIDHeader: []string{job.ID},
		headerClaim:           []string{"1"},
	}}
	ack, err := q.publish(ctx, subject, claim)
	switch {
	case err != nil:
		q.log.Warn("a delayed job is stored without its claim on its id in its lane: the same id submitted without a delay within the dedup window would be stored again",
			"lane", job.Lane, "id", job.ID, "err", err)
		return stored, nil
	case !ack.Duplicate:
		// The claim is its msg id; the message goes at once. (On a
		// lane without keys a drain may have taken and acked it.)
		ls.claimed(ack.Sequence)
		if err := ls.stream.DeleteMsg(ctx, ack.Sequence); err != nil && !gone(err) {
			q.log.Warn("deleting the claim of a delayed job's id failed; it takes a place in its lane until deleted",
				"lane", job.Lane, "id", job.ID, "seq", ack.Sequence, "err", err)
		}
		return stored, nil
	case stored.Duplicate:
		// A resubmission. The id's job is the one the lane holds under
		// it, when it is there and not a claim: a job stored without a
		// delay, whose first delayed duplicate's copy was taken out
		// (the retry stream still remembers that copy's msg id).
		// Its copy is taken out again, as at the first delayed
		// duplicate: gone then, or left there when that delete failed
		// (the submission failed, and this is its repeat).
		if raw, err := ls.stream.GetMsg(ctx, ack.Sequence); err != nil || raw.Header.Get(headerClaim) != "" {
			return stored, nil
		}
	}
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	switch err := st.DeleteMsg(ctx, stored.Seq); {
	case gone(err) && stored.Duplicate:
		// Taken out at an earlier submission.
	case gone(err):
		// It left the retry stream: moved into the lane (the claim
		// came after claimGuard), or expired.
		q.takeBackMoved(ctx, ls, job)
	case err != nil:
		return PubResult{}, fmt.Errorf("%w: lane %s: %s is stored without a delay, and its delayed copy %d could not be deleted: %v",
			ErrUnavailable, job.Lane, job.ID, stored.Seq, err)
	}
	return PubResult{Seq: ack.Sequence, Duplicate: true, Queued: true}, nil
}

// gone reports that a message delete found no message: JetStream answers
// either error for one that was deleted (or acked) first.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful)
}

// takeBackMoved deletes the copy of job, a delayed duplicate of a job
// stored without a delay, from its lane when the retry mover moved it
// there before its claim was answered: found by the msg id it was stored
// and moved under (job.MsgID: scheduledMsgID over HTTP, the intake move's
// for a job published over NATS) while the lane remembers it. A copy a
// drain took already is delivered too (logged).
func (q *Queue) takeBackMoved(ctx context.Context, ls *laneState, job Job) {
	seq, found, err := q.probeMsgID(ctx, ls.stream, InternalSubject(job.Lane, job.Key), job.MsgID)
	if err == nil && !found {
		return
	}
	if err == nil {
		if err = ls.stream.DeleteMsg(ctx, seq); err == nil {
			return
		}
	}
	q.log.Warn("a delayed duplicate of a job stored without a delay entered the lane before its claim was answered; the job may be delivered twice",
		"lane", job.Lane, "id", job.ID, "err", err)
}

// maxClaimsKept bounds the claim sequences a lane remembers for Ahead;
// past it the oldest are forgotten (and counted as jobs ahead again: too
// many, never too few).
const maxClaimsKept = 1 << 16

// claimed remembers that the claim stored at seq of a lane without keys is
// no job, for Ahead. A keyed lane's claims are on no key's subject, which
// its Ahead never counts.
func (ls *laneState) claimed(seq uint64) {
	if ls.keyed {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	i, _ := slices.BinarySearch(ls.claims, seq)
	ls.claims = slices.Insert(ls.claims, i, seq)
	if len(ls.claims) > maxClaimsKept {
		// The oldest quarter at once: one copy per many claims.
		ls.claims = slices.Clone(ls.claims[maxClaimsKept/4:])
	}
}

// claimsBetween counts the claims this instance stored after pos and
// before seq, and forgets those at or before pos (no job is stored before
// a position again). Claims other instances stored are not known here:
// they count as jobs ahead (too many, never too few).
func (ls *laneState) claimsBetween(pos, seq uint64) int64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	past, _ := slices.BinarySearch(ls.claims, pos+1)
	ls.claims = ls.claims[past:]
	before, _ := slices.BinarySearch(ls.claims, seq)
	return int64(before)
}

// scheduledMsgID is the msg id of a delayed job submitted over HTTP. It
// holds spaces, which no job id may: nobody can claim it first.
func scheduledMsgID(lane, id string) string { return "sched " + lane + " " + id }

// storeScheduled stores job's copy in the retry stream, on its lane's
// retry subject, with job.MsgID.
func (q *Queue) storeScheduled(ctx context.Context, job Job) (*jetstream.PubAck, error) {
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	if st == nil {
		return nil, fmt.Errorf("queue: schedule %s: %w: EnsureRetries did not run", job.ID, ErrUnavailable)
	}
	job.Notify = ""
	msg := jobMsg(job)
	if job.Key != "" {
		msg.Header.Set(HeaderKey, job.Key)
	}
	ack, err := q.publish(ctx, RetrySubject(job.Lane), msg)
	if err != nil {
		return nil, fmt.Errorf("lane %s: schedule %s: %w", job.Lane, job.ID, err)
	}
	return ack, nil
}

// schedulePublic moves m, a public job whose publisher asked for a delay,
// to the retry stream to wait until due, then acks it in the lane. Its copy
// has a msg id of its own event (copy.go), so a repeat after a crash
// between the store and the ack stores nothing new.
func (q *Queue) schedulePublic(ctx context.Context, m *Msg) error {
	job := m.job
	job.MsgID = fmt.Sprintf("sched %s %d", m.origin, m.Seq())
	job.EnqueuedAt = time.Time{}
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	if st == nil {
		return fmt.Errorf("queue: schedule %s: %w: EnsureRetries did not run", job.ID, ErrUnavailable)
	}
	msg := jobMsg(job)
	msg.Subject = RetrySubject(job.Lane)
	if job.Key != "" {
		msg.Header.Set(HeaderKey, job.Key)
	}
	if err := q.storeCopy(ctx, st, msg); err != nil {
		return fmt.Errorf("queue: schedule %s: %w", job.ID, err)
	}
	if h := q.hook.get(); h != nil {
		h.Scheduled(job.Lane, job.ID, job.NotBefore, job.Reply)
	}
	return confirmAck(ctx, m.m)
}

// Expiry is when m's job is dead-lettered if it has not started: the
// earlier of its own expiry and its lane's max_age after it entered the
// lane; zero for none, and for a job that started before (a retry).
func (m *Msg) Expiry() time.Time {
	if m.job.Attempts > 0 {
		return time.Time{}
	}
	at := m.job.Expires
	if m.maxAge > 0 {
		if byAge := m.StoredAt().Add(m.maxAge); at.IsZero() || byAge.Before(at) {
			at = byAge
		}
	}
	return at
}

// Expired reports whether m's job has passed its expiry at now.
func (m *Msg) Expired(now time.Time) bool {
	at := m.Expiry()
	return !at.IsZero() && !now.Before(at)
}

// Expire dead-letters m's job with the reason "expired". When the dead
// letter cannot be stored, the job comes back after retryIn, and is
// checked again.
func (m *Msg) Expire(ctx context.Context, retryIn time.Duration) error {
	job := m.job
	at := m.Expiry()
	info := DeadInfo{Reason: ReasonExpired, LastError: "not started by its expiry, " + at.UTC().Format(time.RFC3339Nano)}
	err := m.Dead(ctx, info, retryIn)
	if err != nil && !errors.Is(err, ErrAckUnconfirmed) {
		return err
	}
	if h := m.c.q.hook.get(); h != nil {
		h.Expired(job.Lane, job.ID, job.Reply)
	}
	return err
}

// expireFetched dead-letters a fetched job that expired while it waited in
// the lane, before it takes a slot. A failure leaves it to come back.
func (q *Queue) expireFetched(m *Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*publishTimeout)
	defer cancel()
	if err := m.Expire(ctx, time.Second); err != nil && !errors.Is(err, ErrAckUnconfirmed) {
		q.log.Warn("dead-lettering an expired job failed; trying again", "lane", m.job.Lane, "id", m.job.ID, "err", err)
		return
	}
	q.log.Info("job expired before it started; dead-lettered", "lane", m.job.Lane, "id", m.job.ID)
}

// expireWaiting dead-letters a delayed job that expired before it was
// due, from the retry stream; m is its message there.
func (q *Queue) expireWaiting(ctx context.Context, job Job, m jetstream.Msg, meta *jetstream.MsgMetadata) {
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	var epoch int64
	if st != nil {
		epoch = st.CachedInfo().Created.UnixNano()
	}
	msg := &Msg{job: job, m: m, meta: meta, origin: origin(RetryStream, epoch),
		c: &Consumer{q: q, lane: job.Lane, outstanding: map[*Msg]time.Time{}}}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*publishTimeout)
	defer cancel()
	if err := msg.Expire(dctx, time.Second); err != nil && !errors.Is(err, ErrAckUnconfirmed) {
		q.log.Warn("dead-lettering an expired delayed job failed; trying again", "lane", job.Lane, "id", job.ID, "err", err)
		return
	}
	q.log.Info("delayed job expired before it was due; dead-lettered", "lane", job.Lane, "id", job.ID)
}
