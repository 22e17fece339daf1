package ingest

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// Delay and expiry of a submitted job (queue/schedule.go): the headers
// Throttle-Delay or Throttle-Not-Before, and Throttle-Expires; a batch
// item's delay or not_before, and expires. A delayed job is stored at once
// ("scheduled", its eta_ms the delay) and enters its lane's queue when due,
// without an admission decision now: the lane's bucket and backlog are
// those of the moment it enters.

// Scheduler stores a delayed job to enter its lane when due.
type Scheduler interface {
	Schedule(ctx context.Context, job queue.Job) (queue.PubResult, error)
}

// submissionWhen is what a submission's headers ask of its job's start.
func submissionWhen(r *http.Request) queue.When {
	return queue.When{
		Delay:     r.Header.Get(queue.HeaderThrottleDelay),
		NotBefore: r.Header.Get(queue.HeaderThrottleNotBefore),
		Expires:   r.Header.Get(queue.HeaderThrottleExpires),
	}
}

// scheduleOf reads w for lane at now; a refusal names the field at fault:
// the header of a single submission (field nil), or what field makes of
// a batch item's member ("delay", "not_before", "expires").
func scheduleOf(w queue.When, lane Lane, now time.Time, field func(string) string) (queue.Schedule, *Refusal) {
	if w.IsZero() {
		return queue.Schedule{}, nil
	}
	s, err := queue.ParseSchedule(w, now, lane.maxDelay())
	var se *queue.ScheduleError
	if errors.As(err, &se) {
		if field == nil {
			return s, &Refusal{Err: ErrBadHeader, Cause: err, Field: se.Header(), Detail: se.Header() + ": " + se.Msg}
		}
		return s, &Refusal{Err: ErrBadBody, Cause: err, Field: field(se.Field), Detail: se.Error()}
	}
	return s, nil
}

// maxDelay is the lane's max_delay, or the default.
func (l Lane) maxDelay() time.Duration {
	if l.MaxDelay <= 0 {
		return queue.DefaultMaxDelay
	}
	return l.MaxDelay
}

// submitScheduled stores job, delayed until job.NotBefore, and answers
// "scheduled" with the delay as its eta_ms.
//
// On a lane that keeps results its record is created first, scheduled:
// GET finds it, DELETE cancels it (the drain's claim then refuses it when it
// comes due), and an Idempotency-Key lasts as long as the record. A wait
// (?wait=, in sub) is the immediate path's (openRecord, awaitAnswer): the
// caller's wait is registered before the record is created, the job
// carries its address through the retry stream into its lane, and the
// request is held until the job settles or the wait runs out (then the
// 202 follows, with the job's state as it is then).
func (h *Handler) submitScheduled(w http.ResponseWriter, r *http.Request, name string, lane Lane, job queue.Job, rj *rejecter, sub *submission, keeps, given bool) {
	if h.cfg.Scheduler == nil {
		rj.reject(&Refusal{Err: ErrBadHeader, Field: queue.HeaderThrottleDelay, Detail: "this server does not take delayed jobs"}, "invalid_schedule")
		return
	}
	if keeps {
		if h.openRecord(w, r, rj, &job, sub) {
			return
		}
		if given && h.waitsAsAnother(r.Context(), job) {
			h.undoRecord(job, sub)
			rj.reject(idempotencyConflict(name), "idempotency_key_conflict")
			return
		}
	}
	// Without records an Idempotency-Key is JetStream's de-duplication:
	// the id is claimed in the lane's stream, where a job without a delay
	// is stored under it.
	job.ClaimID = given && !keeps
	res, err := h.cfg.Scheduler.Schedule(r.Context(), job)
	if err != nil {
		h.undoRecord(job, sub)
		h.refuseStore(rj.reject, name, lane, err, "storing a delayed job")
		return
	}
	out := api.Accepted{ID: job.ID, Lane: name, State: api.StateScheduled, Duplicate: res.Duplicate,
		ETAMillis: max(time.Until(job.NotBefore), 0).Milliseconds()}
	state := string(out.State)
	if res.Duplicate {
		state = "duplicate"
	} else {
		h.answers.put(name, job.ID, out.State)
	}
	h.cfg.Metrics.Submitted.WithLabelValues(name, state, "http").Inc()
	// The lane's bucket as it is now, for the rate-limit headers; the job
	// takes nothing from it until it enters the lane.
	dec, derr := h.cfg.Admitter.Decide(r.Context(), lane.Admission, job.Key)
	if derr == nil {
		setRateHeaders(w.Header(), r, name, dec)
	}
	if res.Queued {
		out.State, out.ETAMillis = h.queuedDuplicate(r.Context(), name, lane, job, res.Seq, dec, derr == nil)
	}
	if keeps {
		setLocation(w, name, job.ID)
		if sub.wait > 0 {
			h.dropBody(sub, &job)
			answered, last := h.awaitAnswer(w, r, job, sub)
			if answered {
				return
			}
			out = h.afterWait(r, job, out, last)
		}
	}
	w.Header().Set("Content-Type", jsonContentType)
	w.WriteHeader(http.StatusAccepted)
	buf := answerBufs.Get().(*[]byte)
	*buf = appendAccepted((*buf)[:0], out)
	_, _ = w.Write(*buf)
	if cap(*buf) <= 4<<10 {
		answerBufs.Put(buf)
	}
}

// afterWait is the answer of a delayed job whose wait ran out: its state
// as its record says now (it may have entered its lane, or started), and
// the time left until it is due (0 once due). last is the record the wait
// read last; only a wait that read none reads it again.
func (h *Handler) afterWait(r *http.Request, job queue.Job, out api.Accepted, last api.JobRecord) api.Accepted {
	out.ETAMillis = max(time.Until(job.NotBefore), 0).Milliseconds()
	if last.ID != "" {
		out.State = last.State
		return out
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Second)
	defer cancel()
	if rec, _, err := h.cfg.Records.Get(ctx, job.Lane, job.ID); err == nil && h.viewerOf(r).Sees(rec) {
		out.State = rec.State
	}
	return out
}

// itemField is the JSON pointer of member of batch item i.
func itemField(i int) func(string) string {
	return func(member string) string { return "/" + strconv.Itoa(i) + "/" + member }
}

// itemWhen is a batch item's schedule.
func itemWhen(it api.BatchItem) queue.When {
	return queue.When{Delay: it.Delay, NotBefore: it.NotBefore, Expires: it.Expires}
}

// batchSchedules reads every item's schedule into its job; the first item
// whose schedule cannot be used refuses the batch, naming its member.
func batchSchedules(jobs []batchJob, lane Lane, now time.Time) *Refusal {
	for i := range jobs {
		s, rf := scheduleOf(jobs[i].when, lane, now, itemField(i))
		if rf != nil {
			rf.Detail = "item " + strconv.Itoa(i) + ": " + rf.Detail
			return rf
		}
		jobs[i].job.NotBefore, jobs[i].job.Expires = s.NotBefore, s.Expires
	}
	return nil
}

// delayedItem is a batch item that asked for a delay: its index in the
// batch, its job, whether it named its id, and where its answer goes (out,
// or fail for a refusal).
type delayedItem struct {
	i     int
	job   queue.Job
	given bool
	out   *api.BatchResult
	fail  func(err error, reason string)
}

// storeDelayedItem stores a batch item that asked for a delay, answering it,
// and counts its state.
func (h *Handler) storeDelayedItem(ctx context.Context, name string, lane Lane, it delayedItem, counts map[string]int, keeps bool) {
	job, out, fail := it.job, it.out, it.fail
	if h.cfg.Scheduler == nil {
		fail(&Refusal{Err: ErrBadBody, Field: "delay", Detail: "this server does not take delayed jobs"}, "invalid_schedule")
		return
	}
	var rec submission
	if keeps {
		rev, old, err := h.scheduledRecord(ctx, job)
		switch {
		case errors.Is(err, records.ErrExists) && old.Owner != job.Owner:
			fail(itemConflict(name, it.i), "idempotency_key_conflict")
			return
		case errors.Is(err, records.ErrExists):
			*out = api.BatchResult{Status: http.StatusAccepted, ID: old.ID, State: old.State, Duplicate: true}
			counts["duplicate"]++
			return
		case err != nil:
			fail(err, "records_unavailable")
			return
		}
		rec.rev, job.RecordRev = rev, rev
		if it.given && h.waitsAsAnother(ctx, job) {
			h.undoRecord(job, &rec)
			fail(itemConflict(name, it.i), "idempotency_key_conflict")
			return
		}
	}
	job.ClaimID = it.given && !keeps // as a single submission's
	res, err := h.cfg.Scheduler.Schedule(ctx, job)
	if err != nil {
		h.undoRecord(job, &rec)
		h.refuseStore(fail, name, lane, err, "storing a delayed job")
		return
	}
	*out = api.BatchResult{Status: http.StatusAccepted, ID: job.ID, State: api.StateScheduled, Duplicate: res.Duplicate,
		ETAMillis: max(time.Until(job.NotBefore), 0).Milliseconds()}
	if res.Queued {
		dec, err := h.cfg.Admitter.Decide(ctx, lane.forKey(job.Key), job.Key)
		out.State, out.ETAMillis = h.queuedDuplicate(ctx, name, lane, job, res.Seq, dec, err == nil)
	}
	if res.Duplicate {
		counts["duplicate"]++
		return
	}
	h.answers.put(name, job.ID, out.State)
	counts[string(out.State)]++
}

// queuedDuplicate is the state and eta_ms of a delayed submission whose id
// names a job stored in its lane without a delay, at seq
// (queue.PubResult.Queued): as a resubmission of that job without a delay
// is answered, its first answer's state, else queued with its eta afresh
// (from dec, when decided).
func (h *Handler) queuedDuplicate(ctx context.Context, name string, lane Lane, job queue.Job, seq uint64, dec admission.Decision, decided bool) (api.JobState, int64) {
	state := api.StateQueued
	if first, ok := h.answers.get(name, job.ID); ok {
		state = first
	}
	if state != api.StateQueued || !decided {
		return state, 0
	}
	return state, h.eta(ctx, dec, lane, name, job.Key, seq).Milliseconds()
}

// scheduledRecord creates the record of a delayed job, scheduled, before
// the job is stored (create-if-absent: records.ErrExists answers the job
// an earlier submission of its Idempotency-Key made).
func (h *Handler) scheduledRecord(ctx context.Context, job queue.Job) (uint64, api.JobRecord, error) {
	now := time.Now().UTC()
	return h.cfg.Records.Create(ctx, api.JobRecord{ID: job.ID, Lane: job.Lane, Key: job.Key,
		State: api.StateScheduled, StoredAt: &now, Attempts: []api.JobAttempt{}, Callback: job.Callback, Owner: job.Owner})
}
