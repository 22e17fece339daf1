package ingest

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// Every refusal the API answers is an error, and problemFor turns an error
// into its problem through one table: a new kind of refusal adds a row
// here, not a copy of a problem literal at the place that refuses. Where
// the request is wrong, the handler returns a *Refusal (the class, the
// field at fault, the detail the client reads); what the stores and the
// admission decision return goes through the table as it is.

// Classes of refusal that only the HTTP API makes; each has its row.
var (
	ErrShuttingDown = errors.New("this instance is shutting down")
	ErrUnknownLane  = errors.New("no such lane")
	// ErrBodiesBusy: the bytes of the bodies read at once reached
	// max_body_inflight.
	ErrBodiesBusy = errors.New("too many request bodies are being read at once")
	// ErrCallerBodiesBusy: the bytes of one caller's bodies read at once
	// reached its share, max_body_inflight_per_caller.
	ErrCallerBodiesBusy = errors.New("the caller's request bodies being read at once reached its share")
	ErrBodyTimeout      = errors.New("the body did not arrive within read_timeout")
	ErrBodyTooLarge     = errors.New("the body is too large")
	ErrBadBody          = errors.New("the body is not valid")
	ErrBadHeader        = errors.New("a header is not valid")
	ErrBadParam         = errors.New("a path or query parameter is not valid")
	ErrNotFound         = errors.New("not found")
	// ErrCallerQuota: the caller is over its plan or its IP over the
	// per-IP limit; ErrOverPlan: the request costs more than the plan's
	// burst, so that it can never fit.
	ErrCallerQuota = errors.New("the caller is over its quota")
	ErrOverPlan    = errors.New("the request costs more than the caller's plan allows at once")
	// Access: no or an unknown API key; a key without the route's scope;
	// a Host this server does not answer to; a state-changing request
	// from another site.
	ErrUnauthorized = errors.New("no known API key")
	ErrForbidden    = errors.New("the API key lacks the scope")
	ErrUnknownHost  = errors.New("unknown Host")
	ErrCrossSite    = errors.New("cross-site request")
	// ErrCallbackLane: a submission to a lane that carries other lanes'
	// callbacks (results.callback_lane), on which only the throttler
	// stores jobs: it signs them as records the throttler settled.
	ErrCallbackLane = errors.New("the lane carries callbacks; only the throttler stores jobs on it")
	// ErrIdempotencyKeyConflict: with API keys, a submission's
	// Idempotency-Key names a job of the lane another key submitted; it
	// is neither that job's duplicate nor stored.
	ErrIdempotencyKeyConflict = errors.New("the Idempotency-Key is in use in the lane by another caller")
)

// problemRows is the table: the first row whose error the refusal matches
// (errors.Is) gives its problem type, status, default field and the wait
// before a retry (Retry-After; a 429 or 503 always has one, at least 1 s).
// A refusal that matches no row is the service's failure: 503, retry in
// a second.
var problemRows = []struct {
	err    error
	typ    string
	status int
	field  string
	retry  time.Duration
}{
	{ErrShuttingDown, ProblemShuttingDown, http.StatusServiceUnavailable, "", time.Second},
	{ErrUnknownLane, ProblemUnknownLane, http.StatusNotFound, "lane", 0},
	{ErrBodiesBusy, ProblemOverloaded, http.StatusServiceUnavailable, "max_body_inflight", time.Second},
	{ErrCallerBodiesBusy, ProblemOverloaded, http.StatusTooManyRequests, "max_body_inflight_per_caller", time.Second},
	{ErrBodyTimeout, ProblemRequestTimeout, http.StatusRequestTimeout, "body", 0},
	{ErrBodyTooLarge, ProblemBodyTooLarge, http.StatusRequestEntityTooLarge, "body", 0},
	{ErrStrictJSON, ProblemBadBody, http.StatusBadRequest, "body", 0},
	{ErrBadBody, ProblemBadBody, http.StatusBadRequest, "body", 0},
	// A limit a body asked for (a *bucket.LimitError names its field).
	{bucket.ErrInvalidRate, ProblemBadBody, http.StatusBadRequest, "rate", 0},
	{bucket.ErrInvalidLimit, ProblemBadBody, http.StatusBadRequest, "rate", 0},
	{ErrBadHeader, ProblemBadHeader, http.StatusBadRequest, "", 0},
	// Where a job asks to go, refused by the lane's lists (a *dest.Error
	// names the header); a batch item's or a key's come as ErrBadBody.
	{dest.ErrPathEscapes, ProblemBadHeader, http.StatusBadRequest, dest.HeaderPath, 0},
	{dest.ErrBadPath, ProblemBadHeader, http.StatusBadRequest, dest.HeaderPath, 0},
	{dest.ErrMethodNotAllowed, ProblemBadHeader, http.StatusBadRequest, dest.HeaderMethod, 0},
	{dest.ErrHeaderNotAllowed, ProblemBadHeader, http.StatusBadRequest, "", 0},
	{dest.ErrBadHeaderValue, ProblemBadHeader, http.StatusBadRequest, "", 0},
	{dest.ErrURLNotAllowed, ProblemBadHeader, http.StatusBadRequest, dest.HeaderURL, 0},
	{dest.ErrNotHTTP, ProblemBadHeader, http.StatusBadRequest, "", 0},
	{ErrBadParam, ProblemBadQuery, http.StatusBadRequest, "", 0},
	{ErrNotKeyed, ProblemNotFound, http.StatusNotFound, "lane", 0},
	{queue.ErrNotFound, ProblemNotFound, http.StatusNotFound, "seq", 0},
	{queue.ErrReplayExpired, ProblemJobExpired, http.StatusConflict, "expires", 0},
	// 409, not 422: the request is well formed; the dead letter's key
	// conflicts with its lane's key rules, a state the caller resolves
	// (a replay with ?key=, or a delete), as for job-expired.
	{queue.ErrReplayUndeliverable, ProblemReplayUndeliverable, http.StatusConflict, "key", 0},
	{ErrNotFound, ProblemNotFound, http.StatusNotFound, "", 0},
	// Job records (jobs.go).
	{api.ErrJobNotFound, ProblemNotFound, http.StatusNotFound, "id", 0},
	{api.ErrJobStarted, ProblemJobStarted, http.StatusConflict, "id", 0},
	{ErrIdempotencyKeyConflict, ProblemIdempotencyKeyConflict, http.StatusConflict, "Idempotency-Key", 0},
	{records.ErrTooManyWaiters, ProblemOverloaded, http.StatusServiceUnavailable, "wait", time.Second},
	{records.ErrCallerWaits, ProblemOverloaded, http.StatusTooManyRequests, "wait", time.Second},
	// The admission decision's refusal (a *admission.RejectError names
	// its field and when to retry) and the queue's.
	{admission.ErrBacklogFull, ProblemBacklogFull, http.StatusTooManyRequests, "max_backlog", 0},
	{queue.ErrFull, ProblemStorageFull, http.StatusServiceUnavailable, "max_bytes", 5 * time.Second},
	{ErrCallerQuota, ProblemCallerQuota, http.StatusTooManyRequests, "", 0},
	{ErrOverPlan, ProblemOverPlan, http.StatusRequestEntityTooLarge, "cost", 0},
	{ErrUnauthorized, ProblemUnauthorized, http.StatusUnauthorized, "Authorization", 0},
	{ErrForbidden, ProblemForbidden, http.StatusForbidden, "Authorization", 0},
	{ErrCallbackLane, ProblemForbidden, http.StatusForbidden, "lane", 0},
	{ErrUnknownHost, ProblemUnknownHost, http.StatusMisdirectedRequest, "Host", 0},
	{ErrCrossSite, ProblemCrossSite, http.StatusForbidden, "Origin", 0},
}

// Refusal is a request refused by the API: Err is its class (a row of the
// table, or an error the table classifies) and Cause what made it, both
// kept in the chain; Field names the request part at fault (a header, a
// parameter, a JSON pointer) when it is not the row's, Detail is what the
// client reads. Status and RetryAfter, when set, replace the row's.
type Refusal struct {
	Err        error
	Cause      error
	Field      string
	Detail     string
	Status     int
	RetryAfter time.Duration
}

func (e *Refusal) Error() string {
	if e.Detail != "" {
		return e.Detail
	}
	if e.Cause != nil {
		return e.Err.Error() + ": " + e.Cause.Error()
	}
	return e.Err.Error()
}

// Unwrap keeps both the class and the cause in the chain.
func (e *Refusal) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

// refusal makes a *Refusal of class err naming field, with a detail made by
// fmt.Sprintf(format, args...).
func refusal(err error, field, format string, args ...any) *Refusal {
	return &Refusal{Err: err, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// problemFor is the problem that answers err: the row err matches, the
// field and wait a *Refusal, a *admission.RejectError or a
// *bucket.LimitError names, and as detail the refusal's (else err's own
// text). RetryAfterSeconds is set for the statuses that carry Retry-After.
func problemFor(err error) api.Problem {
	p := api.Problem{Type: ProblemUnavailable, Status: http.StatusServiceUnavailable, Detail: err.Error()}
	retry := time.Second
	for _, row := range problemRows {
		if errors.Is(err, row.err) {
			p.Type, p.Status, p.Field, retry = row.typ, row.status, row.field, row.retry
			break
		}
	}
	var rej *admission.RejectError
	if errors.As(err, &rej) {
		p.Field, retry = rej.Field, rej.RetryAfter
	}
	var le *bucket.LimitError
	if errors.As(err, &le) {
		p.Field = le.Field
	}
	var de *dest.Error
	if errors.As(err, &de) {
		p.Field = de.Field
	}
	var rf *Refusal
	if errors.As(err, &rf) {
		if rf.Field != "" {
			p.Field = rf.Field
		}
		if rf.Status != 0 {
			p.Status = rf.Status
		}
		if rf.RetryAfter > 0 {
			retry = rf.RetryAfter
		}
	}
	p.Title = http.StatusText(p.Status)
	if retry > 0 || p.Status == http.StatusTooManyRequests || p.Status == http.StatusServiceUnavailable {
		p.RetryAfterSeconds = retryAfterSeconds(retry)
	}
	return p
}

// writeError answers a request with the problem of err (problemFor).
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	writeProblem(w, r, p, time.Duration(p.RetryAfterSeconds)*time.Second)
}

// problemOf is problemFor for the handlers that answer a *api.Problem; nil
// for nil.
func problemOf(err error) *api.Problem {
	if err == nil {
		return nil
	}
	p := problemFor(err)
	return &p
}

// errBodiesBusy answers a body that would take the budget of bodies read at
// once over max_body_inflight.
var errBodiesBusy = refusal(ErrBodiesBusy, "", "too many request bodies are being read at once; retry")

// admissionRefusal is the admission decision's error for a job of lane, as
// a single job and a batch item answer it: a refusal with its wait (a
// *admission.RejectError), else the decision failed.
func admissionRefusal(lane string, err error) error {
	var rej *admission.RejectError
	if errors.As(err, &rej) {
		return &Refusal{Err: err, Detail: fmt.Sprintf("lane %s has %d jobs waiting, over its %s; retry after the estimated wait", lane, rej.Backlog, rej.Field)}
	}
	return &Refusal{Err: err, Detail: "admission failed: " + err.Error()}
}

// storeRefusal is the queue's error for a job of lane that it did not
// store, as a single job and a batch item answer it.
func storeRefusal(name string, lane Lane, err error) error {
	switch {
	case errors.Is(err, queue.ErrFull):
		return refusalOf(err, "lane %s's queue storage is full; this job was not stored", name)
	case errors.Is(err, queue.ErrBacklogFull):
		rf := refusalOf(err, "lane %s holds its max_backlog of %d jobs", name, lane.Admission.MaxBacklog)
		rf.RetryAfter = lane.Admission.Limit.Period()
		return rf
	}
	return refusalOf(err, "the job could not be stored durably and was not accepted; retry")
}

// refusalOf is a *Refusal whose class is err itself (a store's error the
// table classifies), with a detail for the client.
func refusalOf(err error, format string, args ...any) *Refusal {
	return &Refusal{Err: err, Detail: fmt.Sprintf(format, args...)}
}

// refuseStore answers, through reject, a job that could not be stored: the
// problem of storeRefusal, counted by reason; an unavailable queue is also
// logged ("<what> failed").
func (h *Handler) refuseStore(reject func(error, string), name string, lane Lane, err error, what string) {
	switch err = storeRefusal(name, lane, err); {
	case errors.Is(err, queue.ErrFull):
		reject(err, "storage_full")
	case errors.Is(err, queue.ErrBacklogFull):
		reject(err, "backlog_full")
	default:
		reject(err, "queue_unavailable")
		h.cfg.Logger.Warn(what+" failed", "lane", name, "err", err)
	}
}
