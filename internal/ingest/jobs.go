package ingest

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// JobRecords are the job records of the lanes with results
// (records.Store): intake creates a job's record before it stores the job
// (create-if-absent: an Idempotency-Key lasts as long as the record), and
// GET and DELETE of a job read and cancel it.
//
// With API keys, a record belongs to the key that submitted its job
// (api.JobRecord.Owner): a key reads, waits for, cancels and lists only
// its own jobs, an admin key every job (viewerOf); a job it may not see
// answers 404 as an id never stored does. A resubmission of an
// Idempotency-Key whose record another key owns is refused (409,
// ErrIdempotencyKeyConflict), never answered as that job's duplicate.
type JobRecords interface {
	Create(ctx context.Context, rec api.JobRecord) (uint64, api.JobRecord, error)
	Undo(ctx context.Context, lane, id string, rev uint64) error
	Get(ctx context.Context, lane, id string) (api.JobRecord, uint64, error)
	Cancel(ctx context.Context, lane, id string, v records.Viewer, now time.Time) (api.JobRecord, error)
	Recent(ctx context.Context, lane string, v records.Viewer, state api.JobState, limit int) ([]api.JobRecord, error)
	// CancelStored cancels a job found in its lane's stream without a
	// record (a SeqID id, or a job published over NATS).
	CancelStored(ctx context.Context, w records.Waiting, v records.Viewer, now time.Time) (api.JobRecord, error)
	// Queued is the record of a job found in its lane's stream without
	// one.
	Queued(w records.Waiting) api.JobRecord
	// Wait waits for a job to settle: from ch (nil: none), else by
	// reading its record every poll; only records v sees count.
	Wait(ctx context.Context, ch <-chan api.JobRecord, lane, id string, v records.Viewer, poll time.Duration) (api.JobRecord, bool)
}

// StoredJobs finds a job that waits in its lane's stream without a record
// (queue.Queue.Lookup): one stored with a SeqID id, or one published over
// NATS; such a job has no record until the drain claims it.
type StoredJobs interface {
	Lookup(ctx context.Context, lane, id string) (queue.Job, time.Time, error)
	// JobAt reads the job stored at seq (a duplicate's first copy).
	JobAt(ctx context.Context, lane string, seq uint64) (queue.Job, error)
}

// Waiting holds this instance's callers that wait for their jobs
// (records.Waiters).
type Waiting interface {
	Address() string
	Expect(lane, id, caller string) (<-chan api.JobRecord, func(), error)
}

var (
	_ JobRecords = (*records.Store)(nil)
	_ Waiting    = (*records.Waiters)(nil)
	_ StoredJobs = (*queue.Queue)(nil)
)

// Headers of a waited answer.
const (
	HeaderTargetStatus = "Throttle-Target-Status"
	HeaderJobID        = "Throttle-Job-Id"
	// HeaderJobState says the state of the job a waited answer is about.
	HeaderJobState = "Throttle-Job-State"
	// HeaderBodyTruncated: the target's body was longer than the lane's
	// results.max_body and was cut.
	HeaderBodyTruncated = "Throttle-Body-Truncated"
)

// ProblemJobStarted: a cancel came after the job started or settled.
const ProblemJobStarted = "urn:throttler:problem:job-started"

// ProblemJobExpired: a replay of a dead letter whose job's expiry
// (Throttle-Expires) has passed.
const ProblemJobExpired = "urn:throttler:problem:job-expired"

// ProblemReplayUndeliverable: a replay of a dead letter whose job could
// never be delivered on its lane: no key on a keyed lane, or a key the
// lane refuses (queue.ErrReplayUndeliverable).
const ProblemReplayUndeliverable = "urn:throttler:problem:replay-undeliverable"

// ProblemIdempotencyKeyConflict: with API keys, a submission's
// Idempotency-Key names a job of the lane that another key submitted.
const ProblemIdempotencyKeyConflict = "urn:throttler:problem:idempotency-key-conflict"

// ownerOf is the owner of the jobs r submits (api.JobRecord.Owner): the
// id of its API key when the server takes keys, else "" (one principal).
func (h *Handler) ownerOf(r *http.Request) string {
	if h.keys.Load() == nil {
		return ""
	}
	id, _ := r.Context().Value(callerCtx{}).(string)
	return id
}

// viewerOf is who r reads and cancels jobs as: without API keys, and with
// an admin key, every job; with another key, the jobs it submitted.
func (h *Handler) viewerOf(r *http.Request) records.Viewer {
	if h.keys.Load() == nil {
		return records.Everyone
	}
	s, _ := r.Context().Value(scopesCtx{}).(Scopes)
	return records.Viewer{All: s.Admin, Key: h.ownerOf(r)}
}

// idempotencyConflict refuses a submission whose Idempotency-Key names
// another key's job of lane. Nothing of that job is in it.
func idempotencyConflict(lane string) *Refusal {
	return refusal(ErrIdempotencyKeyConflict, "Idempotency-Key", "the Idempotency-Key is in use in lane %s by another caller; choose another", lane)
}

// itemConflict is idempotencyConflict for batch item i, naming its
// idempotency_key.
func itemConflict(lane string, i int) *Refusal {
	return refusal(ErrIdempotencyKeyConflict, "/"+strconv.Itoa(i)+"/idempotency_key", "item %d: the idempotency_key is in use in lane %s by another caller; choose another", i, lane)
}

// waitPoll is how often a waiting request reads the record of a job whose
// stored copy does not name this instance (a resubmission, a GET ?wait).
const waitPoll = 250 * time.Millisecond

// routeJobs adds the routes of job records; without Records they answer
// 404 for every job.
func (h *Handler) routeJobs() {
	// A key reads and cancels the jobs of the lanes it may submit to.
	h.mux.HandleFunc("GET /v1/lanes/{lane}/jobs", h.authorize(needSubmit, h.listJobs))
	h.mux.HandleFunc("GET /v1/lanes/{lane}/jobs/{id}", h.authorize(needSubmit, h.getJob))
	h.mux.HandleFunc("DELETE /v1/lanes/{lane}/jobs/{id}", h.authorize(needSubmit, h.cancelJob))
}

// jobOf reads the {lane} and {id} of a job route; ok is false after a
// refusal was written.
func (h *Handler) jobOf(w http.ResponseWriter, r *http.Request) (name, id string, lane Lane, ok bool) {
	name, id = r.PathValue("lane"), r.PathValue("id")
	if lane, ok = h.cfg.Lanes.Lane(name); !ok {
		writeError(w, r, refusal(ErrUnknownLane, "", "no lane named %q is configured", clip(name)))
		return name, id, lane, false
	}
	if err := queue.ValidJobID(id); err != nil {
		writeError(w, r, &Refusal{Err: ErrBadParam, Cause: err, Field: "id", Detail: "id: " + err.Error()})
		return name, id, lane, false
	}
	if lane.ResultsMaxWait == 0 || h.cfg.Records == nil {
		writeError(w, r, &Refusal{Err: api.ErrJobNotFound, Field: "id", Detail: "lane " + name + " keeps no job records (no results in its config)"})
		return name, id, lane, false
	}
	return name, id, lane, true
}

// Bounds of GET /v1/lanes/{lane}/jobs.
const (
	defaultJobList = 50
	maxJobList     = 200
)

// listJobs answers a lane's most recently changed records that the caller
// sees (viewerOf), newest first; ?state= keeps one state, ?limit= (1 to
// 200, default 50) bounds them. A key that sees only its own jobs gets up
// to limit of them from among the lane's last 2,000 changed records
// (records.Store.Recent reads no more for one answer).
func (h *Handler) listJobs(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("lane")
	lane, ok := h.cfg.Lanes.Lane(name)
	if !ok {
		writeError(w, r, refusal(ErrUnknownLane, "", "no lane named %q is configured", clip(name)))
		return
	}
	q := r.URL.Query()
	state := api.JobState(q.Get("state"))
	switch state {
	case "", api.StateScheduled, api.StateQueued, api.StateInFlight, api.StateRetrying, api.StateDelivered, api.StateDead, api.StateCancelled, api.StateExpired:
	default:
		writeError(w, r, refusal(ErrBadParam, "state", "state must be one of scheduled, queued, in_flight, retrying, delivered, dead, cancelled, expired; got %q", clip(string(state))))
		return
	}
	limit := defaultJobList
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxJobList {
			writeError(w, r, refusal(ErrBadParam, "limit", "limit must be 1 to %d, got %q", maxJobList, clip(v)))
			return
		}
		limit = n
	}
	if lane.ResultsMaxWait == 0 || h.cfg.Records == nil {
		writeJSON(w, http.StatusOK, api.JobList{Jobs: []api.JobRecord{}})
		return
	}
	recs, err := h.cfg.Records.Recent(r.Context(), name, h.viewerOf(r), state, limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.JobList{Jobs: recs})
}

// getJob answers a job's record; ?wait=30s holds the request until the job
// settles (at most the lane's results.max_wait).
func (h *Handler) getJob(w http.ResponseWriter, r *http.Request) {
	name, id, lane, ok := h.jobOf(w, r)
	if !ok {
		return
	}
	wait, err := parseWait(r, lane)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rec, err := h.readRecord(r.Context(), name, id)
	if err == nil && !h.viewerOf(r).Sees(rec) {
		// Another key's job, or one published over NATS: answered as an
		// id never stored, so that its existence is not told.
		err = api.ErrJobNotFound
	}
	if err != nil {
		writeError(w, r, recordRefusal(err, id))
		return
	}
	if wait > 0 && !rec.State.Settled() {
		// The wait holds a slot of the instance's waits, as a waited
		// submission does: it reads the record every waitPoll.
		ch, release, err := h.expectWait(r, name, id)
		if err != nil {
			writeError(w, r, err)
			return
		}
		defer release()
		ctx, cancel := h.waitContext(r.Context(), wait)
		defer cancel()
		if got, settled := h.cfg.Records.Wait(ctx, ch, name, id, h.viewerOf(r), waitPoll); settled || got.ID != "" {
			rec = got
		}
	}
	writeJSON(w, http.StatusOK, rec)
}

// cancelJob cancels a job that has not started: 200 with its record, state
// cancelled; 409 once it started or settled.
func (h *Handler) cancelJob(w http.ResponseWriter, r *http.Request) {
	name, id, _, ok := h.jobOf(w, r)
	if !ok {
		return
	}
	// A job the caller does not see is not found, as an id never stored
	// is; the check is part of each cancel's compare-and-set.
	v := h.viewerOf(r)
	rec, err := h.cfg.Records.Cancel(r.Context(), name, id, v, time.Now())
	if errors.Is(err, api.ErrJobNotFound) {
		job, stored, found, lerr := h.stored(r.Context(), name, id)
		switch {
		case lerr != nil:
			err = lerr
		case found:
			rec, err = h.cfg.Records.CancelStored(r.Context(), waitingOf(name, id, job, stored), v, time.Now().UTC())
		default:
			// Not in the stream either: the job may have started, and
			// even left, between the two reads. Its claim was written
			// before its start, so its record is there now.
			rec, err = h.cfg.Records.Cancel(r.Context(), name, id, v, time.Now())
		}
	}
	if err != nil {
		if errors.Is(err, api.ErrJobStarted) {
			err = &Refusal{Err: api.ErrJobStarted, Field: "id", Detail: "job " + id + " is " + string(rec.State) + ": only a scheduled or queued job can be cancelled"}
		}
		writeError(w, r, recordRefusal(err, id))
		return
	}
	h.cfg.Logger.Info("job cancelled", "caller", callerOf(r), "lane", name, "id", id)
	writeJSON(w, http.StatusOK, rec)
}

// readRecord reads a job's record; a job without one that waits in its
// lane's stream (a SeqID id, or published over NATS) is queued, with what
// its claim will keep (records.Store.Queued): a job that started has a
// record, written by its claim before it started.
func (h *Handler) readRecord(ctx context.Context, lane, id string) (api.JobRecord, error) {
	rec, _, err := h.cfg.Records.Get(ctx, lane, id)
	if errors.Is(err, api.ErrJobNotFound) {
		job, stored, found, lerr := h.stored(ctx, lane, id)
		if lerr != nil {
			return api.JobRecord{}, lerr
		}
		if found {
			return h.cfg.Records.Queued(waitingOf(lane, id, job, stored)), nil
		}
		// Settled and gone from the stream since the first read.
		rec, _, err = h.cfg.Records.Get(ctx, lane, id)
	}
	return rec, err
}

// waitingOf is a job found in its lane's stream without a record, stored
// at stored.
func waitingOf(lane, id string, job queue.Job, stored time.Time) records.Waiting {
	return records.Waiting{Lane: lane, ID: id, Key: job.Key, Reply: job.Reply, Owner: job.Owner, Stored: stored.UTC()}
}

// stored finds a job without a record in its lane's stream; found is
// false when it is not there, err says the stream could not be read.
func (h *Handler) stored(ctx context.Context, lane, id string) (job queue.Job, at time.Time, found bool, err error) {
	if h.cfg.Stored == nil {
		return queue.Job{}, time.Time{}, false, nil
	}
	job, at, err = h.cfg.Stored.Lookup(ctx, lane, id)
	switch {
	case err == nil:
		return job, at, true, nil
	case errors.Is(err, queue.ErrNoSuchJob):
		return queue.Job{}, time.Time{}, false, nil
	}
	return queue.Job{}, time.Time{}, false, err
}

// recordRefusal names the job of a record store's refusal.
func recordRefusal(err error, id string) error {
	if errors.Is(err, api.ErrJobNotFound) {
		var rf *Refusal
		if !errors.As(err, &rf) {
			return &Refusal{Err: api.ErrJobNotFound, Cause: err, Field: "id", Detail: "no record of job " + clip(id) + ": never stored, older than the lane's results.keep, or published over NATS with a Nats-Msg-Id longer than nats.dedup_window ago and not started yet"}
		}
	}
	return err
}

// parseWait reads ?wait= (a Go duration, "30s"): 0 when absent; a value
// that does not parse, is negative, or exceeds the lane's results.max_wait
// (or a lane without results) is refused naming wait.
func parseWait(r *http.Request, lane Lane) (time.Duration, error) {
	q := r.URL.Query()
	if !q.Has("wait") {
		return 0, nil
	}
	v := q.Get("wait")
	if lane.ResultsMaxWait == 0 {
		return 0, refusal(ErrBadParam, "wait", "the lane keeps no job records (no results in its config): it cannot wait for an answer")
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		if n, nerr := strconv.ParseFloat(v, 64); nerr == nil {
			d, err = time.Duration(n*float64(time.Second)), nil
		}
	}
	switch {
	case err != nil:
		return 0, &Refusal{Err: ErrBadParam, Cause: err, Field: "wait", Detail: "wait must be a duration such as 30s, got " + strconv.Quote(clip(v))}
	case d < 0:
		return 0, refusal(ErrBadParam, "wait", "wait must not be negative, got %s", clip(v))
	case d > lane.ResultsMaxWait:
		return 0, refusal(ErrBadParam, "wait", "wait is %v; the lane's results.max_wait is %v", d, lane.ResultsMaxWait)
	}
	return d, nil
}

// submission is what a submission to a lane with results carries between
// its steps: the record's revision, the wait, and the body's part of the
// budget of bodies read at once, given back before a wait (dropBody).
type submission struct {
	rev     uint64
	wait    time.Duration
	ch      <-chan api.JobRecord
	release func()
	body    reservation
}

// dropBody gives back the body's bytes of the budget of bodies read at
// once and lets go of the payload: a waited submission no longer needs
// its body (stored, or a duplicate), and a wait of up to results.max_wait
// must not hold the bytes that bound the bodies being read.
func (h *Handler) dropBody(s *submission, job *queue.Job) {
	h.bodies.giveOnce(&s.body)
	job.Payload = nil
}

// done releases the submission's waiter.
func (s *submission) done() {
	if s.release != nil {
		s.release()
	}
}

// openRecord registers the caller's wait and creates the job's record
// before the job is stored: queued, or scheduled for a delayed job (its
// NotBefore set). When the job has a record already (its
// Idempotency-Key was used within results.keep) it answers the first
// job: its state, or with a wait its answer, and handled is true; when
// that record is another owner's, it refuses the submission (409)
// instead, telling nothing of that job.
func (h *Handler) openRecord(w http.ResponseWriter, r *http.Request, rj *rejecter, job *queue.Job, s *submission) (handled bool) {
	if s.wait > 0 {
		ch, release, err := h.expectWait(r, job.Lane, job.ID)
		switch {
		case errors.Is(err, records.ErrCallerWaits):
			rj.reject(err, "caller_waiters_full")
			return true
		case err != nil:
			rj.reject(err, "too_many_waiters")
			return true
		}
		s.ch, s.release = ch, release
		job.Wait = h.cfg.Waiters.Address()
	}
	create := h.createRecord
	if !job.NotBefore.IsZero() {
		create = h.scheduledRecord
	}
	rev, old, err := create(r.Context(), *job)
	switch {
	case errors.Is(err, records.ErrExists) && old.Owner != job.Owner:
		rj.reject(idempotencyConflict(job.Lane), "idempotency_key_conflict")
		return true
	case errors.Is(err, records.ErrExists):
		h.laneCache(job.Lane).submitted("duplicate").Inc()
		setLocation(w, old.Lane, old.ID)
		if s.wait > 0 && !old.State.Settled() {
			h.dropBody(s, job)
			ctx, cancel := h.waitContext(r.Context(), s.wait)
			defer cancel()
			if got, settled := h.cfg.Records.Wait(ctx, s.ch, old.Lane, old.ID, h.viewerOf(r), waitPoll); settled {
				old = got
			}
		}
		if s.wait > 0 && old.State.Settled() {
			writeAnswer(w, old)
			return true
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(appendAccepted(nil, api.Accepted{ID: old.ID, Lane: old.Lane, State: old.State, Duplicate: true}))
		return true
	case err != nil:
		rj.reject(err, "records_unavailable")
		return true
	}
	s.rev = rev
	job.RecordRev = rev
	return false
}

// expectWait registers a wait of r's caller (its API key, else its client
// address) for lane's job id; without Waiters (no lane keeps records) it
// refuses as a full instance does.
func (h *Handler) expectWait(r *http.Request, lane, id string) (<-chan api.JobRecord, func(), error) {
	if h.cfg.Waiters == nil {
		return nil, nil, records.ErrTooManyWaiters
	}
	caller := callerOf(r)
	if caller == "anonymous" {
		caller = "ip:" + ipKey(clientIP(r))
	}
	return h.cfg.Waiters.Expect(lane, id, caller)
}

// storedByAnother reports whether the first copy of a duplicate, stored at
// seq, is another caller's job: job's record was created just now (no
// record had its id), so the copy JetStream kept is not this caller's
// unless it is their own earlier submission whose record was undone (a
// publish that failed but was stored). With API keys only: without them
// there is one principal. A copy gone from the stream counts as
// another's; an error reading it as not (the duplicate answer stands).
func (h *Handler) storedByAnother(ctx context.Context, job queue.Job, seq uint64) bool {
	if h.keys.Load() == nil || h.cfg.Stored == nil {
		return false
	}
	first, err := h.cfg.Stored.JobAt(ctx, job.Lane, seq)
	switch {
	case errors.Is(err, queue.ErrNoSuchJob):
		return true
	case err != nil:
		h.cfg.Logger.Warn("reading a duplicate's first copy failed; answered as a duplicate", "lane", job.Lane, "id", job.ID, "err", err)
		return false
	}
	return first.Outside || first.Owner != job.Owner
}

// waitsAsAnother reports whether a job of another caller waits under
// job's id without a record (one published over NATS, found by its
// Nats-Msg-Id): a delayed job, whose record was created just now, must not
// take that id, as an immediate one may not (storedByAnother). With API
// keys only; an error reading the stream counts as no such job.
func (h *Handler) waitsAsAnother(ctx context.Context, job queue.Job) bool {
	if h.keys.Load() == nil {
		return false
	}
	other, _, found, err := h.stored(ctx, job.Lane, job.ID)
	if err != nil {
		h.cfg.Logger.Warn("looking for a waiting job of a delayed job's id failed", "lane", job.Lane, "id", job.ID, "err", err)
		return false
	}
	return found && (other.Outside || other.Owner != job.Owner)
}

// createRecord creates a job's record, queued, before the job is stored.
func (h *Handler) createRecord(ctx context.Context, job queue.Job) (uint64, api.JobRecord, error) {
	now := time.Now().UTC()
	return h.cfg.Records.Create(ctx, api.JobRecord{ID: job.ID, Lane: job.Lane, Key: job.Key,
		State: api.StateQueued, StoredAt: &now, Attempts: []api.JobAttempt{}, Callback: job.Callback, Owner: job.Owner})
}

// undoRecord removes the record of a job that could not be stored.
func (h *Handler) undoRecord(job queue.Job, s *submission) {
	if s.rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := h.cfg.Records.Undo(ctx, job.Lane, job.ID, s.rev); err != nil {
		h.cfg.Logger.Warn("removing the record of a job not stored failed; a resubmission finds it", "lane", job.Lane, "id", job.ID, "err", err)
	}
}

// awaitAnswer holds a waited submission until its job settles and answers
// it (true), or answers nothing when the wait runs out (false: the usual
// 202 follows). last is the record the wait read last, when it read one
// (the caller sees it).
func (h *Handler) awaitAnswer(w http.ResponseWriter, r *http.Request, job queue.Job, s *submission) (answered bool, last api.JobRecord) {
	ctx, cancel := h.waitContext(r.Context(), s.wait)
	defer cancel()
	rec, settled := h.cfg.Records.Wait(ctx, s.ch, job.Lane, job.ID, h.viewerOf(r), waitPoll)
	if !settled {
		return false, rec
	}
	writeAnswer(w, rec)
	return true, rec
}

// waitContext bounds a held request's wait by d and by the instance
// stopping (StopIntake).
func (h *Handler) waitContext(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d)
	go func() {
		select {
		case <-h.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// setLocation points at a job's record.
func setLocation(w http.ResponseWriter, lane, id string) {
	w.Header().Set("Location", "/v1/lanes/"+url.PathEscape(lane)+"/jobs/"+url.PathEscape(id))
}

// writeAnswer answers a waited submission of a settled job: 200 with the
// target's body and content type, the headers its record kept
// (results.headers) but those the answer sets itself or must not take
// from a target (answerOwns), its status in Throttle-Target-Status;
// for a job settled without an answer (cancelled, expired, dead after
// transport errors) 200 with its record. The target's body is served
// sandboxed: it is the target's, not this server's.
func writeAnswer(w http.ResponseWriter, rec api.JobRecord) {
	hd := w.Header()
	hd.Set(HeaderJobID, rec.ID)
	hd.Set(HeaderJobState, string(rec.State))
	resp := rec.Response
	if resp == nil {
		writeJSON(w, http.StatusOK, rec)
		return
	}
	body := []byte(resp.Body)
	if resp.BodyBase64 != "" {
		body, _ = base64.StdEncoding.DecodeString(resp.BodyBase64)
	}
	ct := resp.Headers["Content-Type"]
	if ct == "" || contentTypeError(ct) != "" {
		ct = "application/octet-stream"
	}
	for name, v := range resp.Headers {
		if !answerOwns(name) {
			hd.Set(name, v)
		}
	}
	hd.Set("Content-Type", ct)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Content-Security-Policy", "sandbox")
	hd.Set(HeaderTargetStatus, strconv.Itoa(resp.Status))
	if resp.Truncated {
		hd.Set(HeaderBodyTruncated, "true")
	}
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// answerOwns reports a header a waited answer does not take from the
// target's kept headers: those it sets itself (the body's framing, the
// sandbox, Location, the rate-limit and Throttle-* headers), hop-by-hop
// ones, and Set-Cookie (the answer comes from this server's origin, not
// the target's).
func answerOwns(name string) bool {
	name = http.CanonicalHeaderKey(name)
	switch name {
	case "Content-Type", "Content-Length", "Content-Encoding", "Content-Security-Policy", "X-Content-Type-Options",
		"Location", "Set-Cookie", "Ratelimit", "Ratelimit-Policy",
		"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	for _, p := range []string{"Throttle-", "Throttler-", "X-Ratelimit-", "Proxy-"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
