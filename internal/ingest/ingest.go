// Package ingest is the HTTP face of the throttler: job submission, lane
// listing, health and readiness. It validates input, asks admission for a
// decision, stores the job through the queue and answers with the decision
// and rate-limit headers. Bad input gets an RFC 9457 problem+json body that
// names the field, and a refused request stores nothing.
//
// Jobs published straight to throttle.<lane> on NATS do not pass through
// here: the lane's stream captures them, and the drain paces them like any
// queued job.
package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/jsonenc"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/tracing"
	"github.com/throttler/throttler/internal/ui"
)

// Admitter decides on one job, and reads the lane's state again after a
// wait.
type Admitter interface {
	Decide(ctx context.Context, lane admission.Lane, key string) (admission.Decision, error)
	// DecideFrom decides on one job of a lane that is not keyed, from a
	// peek of its state made with the caller quotas.
	DecideFrom(ctx context.Context, lane admission.Lane, p admission.Peeked, now time.Time) (admission.Decision, error)
	// DecideN decides on n jobs submitted together (a batch).
	DecideN(ctx context.Context, lane admission.Lane, key string, n int) ([]admission.Decision, []error)
	Refresh(ctx context.Context, lane admission.Lane, key string, d admission.Decision) admission.Decision
}

// Publisher stores a job durably, and says how many jobs wait ahead of a
// stored one.
type Publisher interface {
	Publish(ctx context.Context, job queue.Job) (queue.PubResult, error)
	// PublishBatch stores jobs of one lane with asynchronous publishes in
	// one window: one result per job, in order.
	PublishBatch(ctx context.Context, lane string, jobs []queue.Job) ([]queue.BatchResult, error)
	// Ahead counts the jobs that start before the one stored at seq (on a
	// keyed lane, those of its key).
	Ahead(ctx context.Context, lane, key string, seq uint64, maxAge time.Duration) (int64, error)
}

// Assignments hear the slot a drain assigns a stored job (queue.Hub):
// Expect before the job is stored with Address as its Notify, then wait.
type Assignments interface {
	Address() string
	Expect(lane, id string) (wait func(ctx context.Context, max time.Duration) (t queue.Told, ok bool), cancel func())
}

// HeaderThrottleKey names a keyed lane's key on a submission.
const HeaderThrottleKey = "Throttle-Key"

// Lane is what intake needs of a lane.
type Lane struct {
	Admission admission.Lane
	// KeyLimit, on a keyed lane, is a key's limit now (its override, its
	// slow-down); nil keeps Admission.KeyLimit for every key.
	KeyLimit func(key string) bucket.Limit
	// KeyStarted, on a keyed lane, counts a key's jobs started and not
	// settled (they are still stored, but no longer ahead of a new job).
	KeyStarted func(ctx context.Context, key string) (int, error)
	MaxBody    int64
	// MaxDelay bounds the delay a job may ask for (max_delay); 0:
	// queue.DefaultMaxDelay.
	MaxDelay time.Duration
	// AdmitWait bounds the wait to hear the slot of a job whose lane has
	// room (config admit_wait).
	AdmitWait time.Duration
	// Cost is what one job costs a caller's plan, in tokens (caller
	// quotas); 0 counts as 1.
	Cost int
	// Observe only logs and counts the caller quota refusals of the lane's
	// submissions.
	Observe bool
	// ResultsMaxWait is the lane's results.max_wait; zero: the lane keeps
	// no job records (no results).
	ResultsMaxWait time.Duration
	// Dest checks where a job asks to go (dest.go); nil for a lane whose
	// target is not HTTP, which refuses any such request.
	Dest *dest.Rules
	// Held reports whether an operator holds the lane (PATCH {"paused":
	// true}): its jobs are queued, and no submission waits to hear of a
	// start that cannot come. Nil: never held.
	Held func() bool
	// Callbacks are the lane's results.callback_urls; nil refuses
	// Throttle-Callback.
	Callbacks *dest.Prefixes
	// CallbacksOnly: the lane is another lane's results.callback_lane. It
	// signs what it sends as records the throttler settled, so it takes
	// no submission (ErrCallbackLane).
	CallbacksOnly bool
	// KeyFromURL: a keyed lane with per_key.key_from: url_host. A job
	// without a key that names a URL gets the URL's host as its key
	// (Dest.KeyOf); a key that disagrees with its job's URL is refused.
	KeyFromURL bool
	// KeyWithoutURL, on such a lane, says whether a job naming a key and
	// no URL may be taken (lane.Lane.KeyWithoutURL: the key has its own
	// url or is the host of the lane's url): nil, else why not, naming no
	// field. Nil takes every such job.
	KeyWithoutURL func(key string) error
}

// startsNow reports whether a job the lane has room for may start now: the
// submission then waits up to AdmitWait to hear its slot.
func (l Lane) startsNow(dec admission.Decision) bool {
	return dec.Room && (l.Held == nil || !l.Held())
}

// forKey is the lane's admission for a job of key.
func (l Lane) forKey(key string) admission.Lane {
	a := l.Admission
	if l.KeyLimit != nil && a.KeyLimit != nil {
		kl := l.KeyLimit(key)
		a.KeyLimit = &kl
	}
	return a
}

// Directory finds lanes, reports their live state and changes their limits.
type Directory interface {
	Lane(name string) (Lane, bool)
	Status(ctx context.Context) []api.LaneStatus
	// SetLimit changes a lane's rate and burst on every instance; the
	// change is stored and outlives restarts (a changed file does not
	// undo it: PATCH again).
	SetLimit(ctx context.Context, name string, rate float64, burst int) (api.LaneStatus, error)
}

// Ready reports whether the service can take jobs; nil means ready.
type Ready func(ctx context.Context) error

// Config configures the handler.
type Config struct {
	Admitter  Admitter
	Publisher Publisher
	// Scheduler stores delayed jobs (Throttle-Delay, Throttle-Not-Before);
	// nil refuses them.
	Scheduler Scheduler
	// Assignments, when set, tell intake which jobs start at once;
	// without them every job is answered "queued".
	Assignments Assignments
	Lanes       Directory
	// DeadLetters enables the dead-letter admin endpoints; nil leaves them out.
	DeadLetters DeadLetters
	// Keys serves the keys of keyed lanes (GET|PATCH
	// /v1/lanes/{lane}/keys/{key}); nil: no such routes.
	Keys KeyDirectory
	// Pauser holds and releases lanes (PATCH /v1/lanes/{lane}
	// {"paused": …}); nil refuses a pause.
	Pauser  LanePauser
	Ready   Ready
	Metrics *metrics.Metrics
	// MetricsHandler serves /metrics.
	MetricsHandler http.Handler
	Logger         *slog.Logger
	// Auth says who may call what; the zero value is an open API.
	Auth Auth
	// MaxBodyInflight bounds the bytes of request bodies being read at
	// once across all requests (a body of unknown length counts as its
	// lane's max_body); a request over it gets 503. Zero: no bound.
	MaxBodyInflight int64
	// MaxBodyInflightPerCaller bounds the part of MaxBodyInflight one
	// caller (API key, else client IP) may hold; a request over it gets
	// 429. Zero: no bound per caller.
	MaxBodyInflightPerCaller int64
	// Callers, when set, turns the caller quotas on (callers.go).
	Callers *Callers
	// MaxBatchItems and MaxBatchBytes bound a batch submission (items,
	// body bytes); zero means DefaultMaxBatchItems, DefaultMaxBatchBytes.
	MaxBatchItems int
	MaxBatchBytes int64
	// History serves the lanes' throughput history (GET
	// /v1/lanes/{lane}/history); nil: no such route.
	History HistoryReader
	// Records are the job records of the lanes with results (jobs.go),
	// and Waiters this instance's callers waiting for their jobs; nil: no
	// job routes, and a lane's results are not used.
	Records JobRecords
	Waiters Waiting
	// Stored finds the jobs of lanes with records that wait without one
	// (ids made by intake); nil: such a job is 404 until it starts.
	Stored StoredJobs
	// Traces makes an intake span for each submission (trace.go); nil
	// makes none (the submitter's trace context is stored all the same).
	Traces *tracing.Tracer
}

// Handler is the HTTP API. Create it with New.
type Handler struct {
	cfg      Config
	mux      *router
	draining atomic.Bool
	answers  *answers
	// keys is nil when the API was built without keys (anonymous).
	keys   atomic.Pointer[keySet]
	bodies *budget
	// callers is nil while caller quotas are off.
	callers atomic.Pointer[callerSet]
	usage   quota.Usage
	// lanesSeen caches per-lane values of the submit path (*laneCache).
	lanesSeen sync.Map
	// stopping is closed by StopIntake; stopOnce closes it once.
	stopping chan struct{}
	stopOnce sync.Once
	// idPrefix starts the ids this instance makes for the jobs of lanes
	// with records (queue.SeqID).
	idPrefix string
}

// New builds the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Admitter == nil || cfg.Publisher == nil || cfg.Lanes == nil || cfg.Metrics == nil {
		return nil, errors.New("ingest: Config.Admitter, Publisher, Lanes and Metrics are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, mux: newRouter(cfg.Metrics.HTTP), answers: newAnswers(answerMemory), bodies: newBudget(cfg.MaxBodyInflight, cfg.MaxBodyInflightPerCaller),
		idPrefix: nuid.Next()[:queue.IDPrefixLen-1] + ".", stopping: make(chan struct{})}
	if len(cfg.Auth.Keys) > 0 {
		h.keys.Store(&keySet{keys: append([]Key(nil), cfg.Auth.Keys...)})
	}
	if c := cfg.Callers; c != nil {
		if c.Limiter == nil {
			return nil, errors.New("ingest: Config.Callers.Limiter is required")
		}
		h.callers.Store(&callerSet{CallerPolicy: c.Policy})
		h.initCallerMetrics(c.Policy)
		cfg.Metrics.Callers.Watch(h.utilization)
	}
	// Each route says what its caller needs (docs/API.md, Authentication).
	// A job costs its lane's cost in caller tokens; a batch is charged
	// once its items are counted (chargeJobs).
	h.mux.HandleFunc("POST /v1/lanes/{lane}/jobs", h.traced("POST /v1/lanes/{lane}/jobs", h.guard(needSubmit, 1, h.submit)))
	h.mux.HandleFunc("POST /v1/lanes/{lane}/jobs:batch", h.traced("POST /v1/lanes/{lane}/jobs:batch", h.guard(needSubmit, 0, h.submitBatch)))
	h.mux.HandleFunc("GET /v1/lanes", h.authorize(needRead, h.lanes))
	h.mux.HandleFunc("PATCH /v1/lanes/{lane}", h.authorize(needAdmin, h.admin(h.setLimit)))
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	h.mux.HandleFunc("GET /readyz", h.ready)
	h.mux.HandleFunc("GET /v1/whoami", h.authorize(needKey, h.whoami))
	// The status page's files hold no data and need no key; the page
	// asks the API (with the operator's key) for everything it shows.
	h.mux.Handle("GET /ui", ui.Handler())
	h.mux.Handle("GET /ui/", ui.Handler())
	h.routeAdmin()
	h.routeCallers()
	h.routeKeys()
	h.routeHistory()
	h.routeJobs()
	if cfg.MetricsHandler != nil {
		n := needRead
		if cfg.Auth.PublicMetrics {
			n = needNothing
		}
		h.mux.HandleFunc("GET /metrics", h.authorize(n, cfg.MetricsHandler.ServeHTTP))
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, refusal(ErrNotFound, "", "no route for %s %s", clip(r.Method), clip(r.URL.Path)))
	})
	return h, nil
}

// ServeHTTP implements http.Handler: the Host and cross-site checks, then
// the route (which checks the caller's key).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if cs := h.callers.Load(); cs != nil && len(cs.TrustedProxies) > 0 {
		r = r.WithContext(context.WithValue(r.Context(), clientIPCtx{}, resolveClientIP(r, cs.TrustedProxies)))
	}
	if !h.checkBrowser(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// StopIntake makes every later submission answer 503 (shutdown begins),
// and ends the waits of requests held for their jobs' answers (?wait=):
// they answer what they have (202 and Location), so that a stopping
// instance is not held up to results.max_wait.
func (h *Handler) StopIntake() {
	h.draining.Store(true)
	h.stopOnce.Do(func() { close(h.stopping) })
}

const maxContentType = queue.MaxContentType

// rejecter answers a refused submission with its problem, logged and
// counted by reason (reject). It is a value rather than a closure: the
// closure openLane used to return cost two allocations per request.
type rejecter struct {
	h          *Handler
	w          http.ResponseWriter
	r          *http.Request
	name, what string
}

// reject answers the submission with the problem of err (problemFor);
// reason is the refusal's label in throttler_jobs_rejected_total.
func (rj *rejecter) reject(err error, reason string) {
	h, r := rj.h, rj.r
	p := problemFor(err)
	p.Lane = clip(rj.name)
	p.Field = clip(p.Field)
	h.cfg.Logger.Info(rj.what+" rejected", "caller", callerOf(r), "ip", clientIP(r), "lane", p.Lane, "reason", reason, "status", p.Status, "field", p.Field, "detail", p.Detail)
	h.cfg.Metrics.Rejected.WithLabelValues(metricLane(h.cfg.Lanes, rj.name), reason).Inc()
	writeProblem(rj.w, r, p, time.Duration(p.RetryAfterSeconds)*time.Second)
}

// openLane starts every submission (what: "job" or "batch"): it makes the
// submission's rejecter, and refuses it while this instance stops or when
// the lane does not exist; ok is false then.
func (h *Handler) openLane(w http.ResponseWriter, r *http.Request, what string) (name string, lane Lane, rj rejecter, ok bool) {
	name = r.PathValue("lane")
	rj = rejecter{h: h, w: w, r: r, name: name, what: what}
	if h.draining.Load() {
		rj.reject(refusal(ErrShuttingDown, "", "this instance is shutting down; submit to another"), "shutting_down")
		return name, lane, rj, false
	}
	if lane, ok = h.cfg.Lanes.Lane(name); !ok {
		rj.reject(refusal(ErrUnknownLane, "", "no lane named %q is configured", clip(name)), "unknown_lane")
		return name, lane, rj, false
	}
	if lane.CallbacksOnly {
		rj.reject(refusal(ErrCallbackLane, "lane", "lane %s is the results.callback_lane of other lanes: it signs what it sends as their settled records, so only the throttler stores jobs on it", name), "callback_lane")
		return name, lane, rj, false
	}
	return name, lane, rj, true
}

// readBody reads a submission's body of at most limit bytes, within the
// budget of bodies read at once. A body over limit (by its Content-Length,
// before a byte is read, or as it arrives) is answered with tooBig, and the
// other refusals (budget full, too slow, broken) through reject; ok is
// false then. The caller gives the reserved bytes back (h.bodies.give) once
// it no longer holds the body.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, limit int64, rj *rejecter, tooBig func()) (body []byte, reserved reservation, ok bool) {
	if r.ContentLength > limit {
		// Close rather than read the body to keep the connection.
		w.Header().Set("Connection", "close")
		tooBig()
		return nil, reserved, false
	}
	reserved, full := h.bodies.reserve(bodyCallerOf(r), r.ContentLength, limit)
	switch full {
	case budgetOfCaller:
		rj.reject(h.bodies.fullRefusal(w, full), "body_inflight_caller_full")
		return nil, reserved, false
	case budgetAll:
		rj.reject(h.bodies.fullRefusal(w, full), "body_inflight_full")
		return nil, reserved, false
	}
	var err error
	if r.ContentLength >= 0 {
		// The length is known and within limit (net/http ends the body
		// there): one buffer of that size, no limiting reader.
		body, err = readExactly(r.Body, r.ContentLength)
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	}
	if err != nil {
		h.bodies.give(reserved)
		var over *http.MaxBytesError
		switch {
		case errors.As(err, &over):
			tooBig()
		case errors.Is(err, os.ErrDeadlineExceeded):
			rj.reject(&Refusal{Err: ErrBodyTimeout, Cause: err, Detail: "the body did not arrive within the server's read_timeout"}, "body_timeout")
		default:
			rj.reject(&Refusal{Err: ErrBadBody, Cause: err, Detail: "reading the body failed: " + err.Error()}, "bad_body")
		}
		return nil, reservation{}, false
	}
	return body, reserved, true
}

// contentTypeError says what is wrong with a job's Content-Type, or "" when
// nothing is: at most maxContentType bytes of visible ASCII, spaces and
// tabs (the queue keeps nothing else, and a header is ASCII).
func contentTypeError(ct string) string {
	if len(ct) > maxContentType {
		return fmt.Sprintf("Content-Type is %d bytes; at most %d are allowed", len(ct), maxContentType)
	}
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; (c < ' ' && c != '\t') || c > '~' {
			return fmt.Sprintf("Content-Type has a byte 0x%02x at %d; only visible ASCII, spaces and tabs are allowed", c, i)
		}
	}
	return ""
}

// isJSON reports whether a Content-Type names JSON: application/json or a
// +json type, in any case, parameters aside.
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.TrimSpace(mt)
	const suffix = "+json"
	return strings.EqualFold(mt, jsonContentType) ||
		len(mt) > len("application/")+len(suffix) && strings.EqualFold(mt[:len("application/")], "application/") && strings.EqualFold(mt[len(mt)-len(suffix):], suffix)
}

// readExactly reads a body of n bytes, its Content-Length; a shorter body
// is io.ErrUnexpectedEOF. net/http ends a request's body at its
// Content-Length (HTTP/2 refuses one that goes on), so nothing follows.
func readExactly(body io.Reader, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(body, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}

// maxSmallBody bounds the body of the admin endpoints that change a limit
// (PATCH /v1/lanes/{lane}, PUT /v1/lanes/{lane}/keys/{key}, the caller
// plan endpoints).
const maxSmallBody = 4096

// decodeSmall is readSmall answering the problem of its refusal.
func (h *Handler) decodeSmall(w http.ResponseWriter, r *http.Request, v any, shape string) *api.Problem {
	return problemOf(h.readSmall(w, r, v, shape))
}

// readSmall reads a small strict JSON body (at most maxSmallBody bytes,
// within the budget of bodies read at once) into v with decodeStrict. Its
// refusal names what is wrong: max_body_inflight (or the caller's share of
// it) when the budget is full (the connection is then closed), rate for a
// rate that does not parse (its error says why), the member at fault
// (smallBodyField), else body; the detail says that the body must be shape
// ("a JSON object with rate and/or burst").
func (h *Handler) readSmall(w http.ResponseWriter, r *http.Request, v any, shape string) error {
	release, full := h.bodies.take(bodyCallerOf(r), min(r.ContentLength, maxSmallBody), maxSmallBody)
	if full != budgetOK {
		return h.bodies.fullRefusal(w, full)
	}
	defer release()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSmallBody))
	if err == nil {
		err = decodeStrict(body, v)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, bucket.ErrInvalidRate):
		return err // the rate's own error says why
	}
	return &Refusal{Err: ErrBadBody, Cause: err, Field: smallBodyField(err), Detail: "the body must be " + shape + ": " + err.Error()}
}

// smallBodyField names the field of an admin body that a decode error is
// about: the member a key's fault, a wrong type or a string that is not
// UTF-8 is at ("burst"), else "body" (not JSON, data after it, and an
// unknown key, which the detail names).
func smallBodyField(err error) string {
	var je *JSONError
	if errors.As(err, &je) && je.Pointer != "" && je.Reason != jsonUnknown && je.Reason != jsonSyntax {
		return je.Pointer[1:]
	}
	return "body"
}

func (h *Handler) submit(w http.ResponseWriter, r *http.Request) {
	name, lane, rj, ok := h.openLane(w, r, "job")
	if !ok {
		return
	}
	var sub submission
	keeps := lane.ResultsMaxWait > 0 && h.cfg.Records != nil
	if !keeps {
		lane.ResultsMaxWait = 0
	}
	var err error
	if sub.wait, err = parseWait(r, lane); err != nil {
		rj.reject(err, "invalid_wait")
		return
	}
	defer sub.done()
	id := r.Header.Get("Idempotency-Key")
	given := id != ""
	if given {
		if err := validKey(name, id); err != nil {
			rj.reject(&Refusal{Err: ErrBadHeader, Cause: err, Field: "Idempotency-Key", Detail: err.Error()}, "invalid_idempotency_key")
			return
		}
	} else {
		id = nuid.Next()
	}
	key := ""
	if lane.Admission.KeyLimit != nil {
		// A keyed lane: the key picks the job's bucket and order.
		key = r.Header.Get(HeaderThrottleKey)
		if key == "" && !lane.KeyFromURL {
			rj.reject(refusal(ErrBadHeader, HeaderThrottleKey, "lane %s is keyed: every job needs a Throttle-Key header naming its key", name), "missing_throttle_key")
			return
		}
		if key != "" {
			if err := queue.ValidKey(key); err != nil {
				rj.reject(&Refusal{Err: ErrBadHeader, Cause: err, Field: HeaderThrottleKey, Detail: "Throttle-Key: " + err.Error()}, "invalid_throttle_key")
				return
			}
		}
		if lane.KeyFromURL {
			if key, err = urlKey(key, r.Header.Values(dest.HeaderURL), name, lane); err != nil {
				switch keyFault(err) {
				case faultMissing:
					rj.reject(err, "missing_throttle_key")
				case faultKey:
					rj.reject(err, "invalid_throttle_key")
				default:
					rj.reject(err, "invalid_destination")
				}
				return
			}
		}
		lane.Admission = lane.forKey(key)
	}
	ct := r.Header.Get("Content-Type")
	if why := contentTypeError(ct); why != "" {
		rj.reject(refusal(ErrBadHeader, "Content-Type", "%s", why), "invalid_content_type")
		return
	}
	tc, err2 := jobTrace(r)
	if err = err2; err != nil {
		rj.reject(err, "invalid_trace_context")
		return
	}
	sched, rf := scheduleOf(submissionWhen(r), lane, time.Now(), nil)
	if rf != nil {
		rj.reject(rf, "invalid_schedule")
		return
	}
	jd, err := jobDest(r, lane)
	if err != nil {
		rj.reject(err, "invalid_destination")
		return
	}
	callback, err := jobCallback(r, lane)
	if err != nil {
		rj.reject(err, "invalid_callback")
		return
	}
	if err := refuseReply(r); err != nil {
		rj.reject(err, "invalid_reply")
		return
	}
	tooBig := func() {
		rj.reject(refusal(ErrBodyTooLarge, "", "the body is larger than the lane's max_body of %d bytes", lane.MaxBody), "body_too_large")
	}
	body, reserved, ok := h.readBody(w, r, lane.MaxBody, &rj, tooBig)
	if !ok {
		return
	}
	sub.body = reserved
	defer h.bodies.giveOnce(&sub.body)
	if isJSON(ct) && !utf8.Valid(body) {
		rj.reject(refusal(ErrBadBody, "", "the body is sent as JSON (Content-Type %s) and is not valid UTF-8", ct), "bad_body")
		return
	}
	if !sched.NotBefore.IsZero() {
		h.submitScheduled(w, r, name, lane, queue.Job{ID: id, Lane: name, Key: key, ContentType: ct, Payload: body, Trace: tc,
			NotBefore: sched.NotBefore, Expires: sched.Expires, Dest: jd, Callback: callback, Owner: h.ownerOf(r)}, &rj, &sub, keeps, given)
		return
	}
	var dec admission.Decision
	if info, _ := r.Context().Value(callerInfoCtx{}).(*callerInfo); info != nil && info.lane != nil && key == "" {
		dec, err = h.cfg.Admitter.DecideFrom(r.Context(), lane.Admission, *info.lane, time.Now())
	} else {
		dec, err = h.cfg.Admitter.Decide(r.Context(), lane.Admission, key)
	}
	if err != nil {
		err = admissionRefusal(name, err)
		if errors.Is(err, admission.ErrBacklogFull) {
			rj.reject(err, "backlog_full")
		} else {
			rj.reject(err, "admission_error")
		}
		return
	}
	// The job is its caller's (its API key's, with keys): the owner
	// travels with it, so that the drain's claim of a job stored without
	// a record (below) writes it.
	job := queue.Job{ID: id, Lane: name, Key: key, ContentType: ct, Payload: body, Trace: tc, Expires: sched.Expires, Dest: jd, Callback: callback,
		Owner: h.ownerOf(r)}
	// A job without an Idempotency-Key on a lane with records gets an id
	// that says where it is stored (queue.SeqID): it is found by that id
	// while it waits, and no record is written for it at intake. It waits
	// for its slot under the id made above.
	// A job with a callback gets its record at intake too: a cancel
	// reads the callback from it.
	seqID := keeps && !given && sub.wait == 0 && callback == ""
	if seqID {
		job.ID, job.IDPrefix, job.NotifyID = "", h.idPrefix, id
	}
	if keeps && !seqID && h.openRecord(w, r, &rj, &job, &sub) {
		return
	}
	var wait func(context.Context, time.Duration) (queue.Told, bool)
	if lane.startsNow(dec) && h.cfg.Assignments != nil {
		// The lane has room: the job starts at once if the drain gives it
		// the next slot. Listen before storing it; the drain may be quick.
		var cancel func()
		wait, cancel = h.cfg.Assignments.Expect(name, id)
		defer cancel()
		job.Notify = h.cfg.Assignments.Address()
	}
	res, err := h.cfg.Publisher.Publish(r.Context(), job)
	stored := time.Now()
	if err != nil {
		h.undoRecord(job, &sub)
		h.refuseStore(rj.reject, name, lane, err, "publish")
		return
	}
	if seqID {
		id = queue.SeqID(h.idPrefix, res.Seq)
		job.ID = id
	}
	if res.Duplicate && sub.rev != 0 && h.storedByAnother(r.Context(), job, res.Seq) {
		// A record was made for the id just now, yet JetStream holds a
		// job of that id: another caller's (one published over NATS,
		// waiting without a record). Nothing of it is told.
		h.undoRecord(job, &sub)
		rj.reject(idempotencyConflict(name), "idempotency_key_conflict")
		return
	}
	out := api.Accepted{ID: id, Lane: name, State: api.StateQueued}
	switch {
	case res.Duplicate:
		// Nothing new was stored: the first answer stands.
		out.Duplicate = true
		if first, ok := h.answers.get(name, id); ok {
			out.State = first
		}
		if out.State == api.StateQueued {
			out.ETAMillis = h.eta(r.Context(), dec, lane, name, key, res.Seq).Milliseconds()
		}
	case wait != nil:
		slot, told := wait(r.Context(), lane.AdmitWait)
		waited := time.Since(stored) + slot.In // from storing the job to its start
		switch {
		case told && slot.Free && slot.In <= atOnce && waited <= max(startsAtOnce, dec.Limit.Period()):
			out.State = api.StateAdmitted
			dec.Remaining = max(dec.Remaining-1, 0)
		case told:
			out.ETAMillis = max(slot.In, 0).Milliseconds()
		default:
			// No slot yet: jobs wait ahead of it. The decision is as old as
			// the wait; the next free slot has moved since.
			dec = h.cfg.Admitter.Refresh(r.Context(), lane.Admission, key, dec)
			out.ETAMillis = h.eta(r.Context(), dec, lane, name, key, res.Seq).Milliseconds()
		}
	default:
		out.ETAMillis = h.eta(r.Context(), dec, lane, name, key, res.Seq).Milliseconds()
	}
	if !res.Duplicate {
		h.answers.put(name, id, out.State)
	}
	state := out.State
	if res.Duplicate {
		state = "duplicate"
	}
	lc := h.laneCache(name)
	lc.submitted(state).Inc()
	if callerPolicies(w.Header(), r, name, dec) {
		w.Header().Set("Content-Type", "application/json")
	} else {
		setRateHeadersQuoted(w.Header(), lc.quoted, dec, true)
	}
	if keeps {
		setLocation(w, name, id)
		if sub.wait > 0 {
			h.dropBody(&sub, &job)
		}
		if sub.wait > 0 {
			held := time.Now()
			answered, last := h.awaitAnswer(w, r, job, &sub)
			if answered {
				return
			}
			out = waitedOut(out, last, time.Since(held))
		}
	}
	w.WriteHeader(http.StatusAccepted)
	buf := answerBufs.Get().(*[]byte)
	*buf = appendAccepted((*buf)[:0], out)
	_, _ = w.Write(*buf)
	if cap(*buf) <= 4<<10 {
		answerBufs.Put(buf)
	}
}

// waitedOut is the 202 of a job whose wait ran out: the estimated wait
// less the time the request was held, and the state its record held when
// the wait last read it (in_flight, retrying: the job may have started)
// rather than the one at intake. A record still queued keeps the intake's
// state: an admitted job's record says queued until its attempt starts.
func waitedOut(out api.Accepted, last api.JobRecord, held time.Duration) api.Accepted {
	out.ETAMillis = max(out.ETAMillis-held.Milliseconds(), 0)
	if last.ID != "" && last.State != "" && last.State != api.StateQueued {
		out.State = last.State
	}
	return out
}

// A job is "admitted" when its slot was free (the lane had room) and it
// starts at once: its slot is at most atOnce ahead (the drain's own
// lateness bound for a start, leaky.DefaultMaxLate), and it starts within
// startsAtOnce (or a period, if longer) of JetStream confirming it. A free
// slot can also turn up later, after the drain lost slots to a stall; a job
// that waited for one was queued.
const (
	atOnce       = 2 * time.Millisecond
	startsAtOnce = 25 * time.Millisecond
)

// aheadMaxAge bounds how old the queue's position may be for an ETA.
const aheadMaxAge = 250 * time.Millisecond

// eta estimates the wait of the job of key stored at seq: the lane's (and
// key's) next free slot, then a period per job queued ahead of it (on a
// keyed lane, the key's jobs not started yet).
func (h *Handler) eta(ctx context.Context, dec admission.Decision, lane Lane, name, key string, seq uint64) time.Duration {
	if key == "" || lane.KeyStarted == nil {
		return dec.ETA(h.ahead(ctx, dec, name, key, seq, 0))
	}
	// A keyed job waits for its key's next free slot and its key's jobs
	// not started yet. A job reserved between reading the key's state and
	// counting its started jobs would be in neither: the state is read
	// again until the count did not move around it (a few tries). The
	// last count read is the one subtracted from the jobs ahead.
	n, err := lane.KeyStarted(ctx, key)
	for range 3 {
		d := h.cfg.Admitter.Refresh(ctx, lane.forKey(key), key, dec)
		m, err2 := lane.KeyStarted(ctx, key)
		if err == nil && err2 == nil && m == n {
			return d.ETA(h.ahead(ctx, d, name, key, seq, m))
		}
		dec, n, err = d, m, err2
	}
	if err != nil {
		n = 0
	}
	return dec.ETA(h.ahead(ctx, dec, name, key, seq, n))
}

// ahead counts the jobs queued ahead of the one of key stored at seq, less
// started: the key's jobs started and not settled, which the queue still
// counts.
func (h *Handler) ahead(ctx context.Context, dec admission.Decision, name, key string, seq uint64, started int) int64 {
	ahead, err := h.cfg.Publisher.Ahead(ctx, name, key, seq, aheadMaxAge)
	if err != nil {
		return dec.Backlog
	}
	return max(ahead-int64(started), 0)
}

// setRateHeaders writes the rate-limit headers of a job's answer: every
// policy (the caller's per-IP and plan policies from r's context, then the
// lane's bucket) in RateLimit-Policy and RateLimit, and in X-RateLimit-*
// the caller's plan when one applies, else its per-IP layer, else the
// lane's bucket. Without caller policies it is the lane's alone.
func setRateHeaders(h http.Header, r *http.Request, lane string, d admission.Decision) {
	if callerPolicies(h, r, lane, d) {
		return
	}
	setRateHeadersQuoted(h, strconv.Quote(lane), d, false)
}

// callerPolicies writes the headers with the caller's policies when r has
// any, and reports whether it did.
func callerPolicies(h http.Header, r *http.Request, lane string, d admission.Decision) bool {
	info, ok := r.Context().Value(callerInfoCtx{}).(*callerInfo)
	if !ok || len(info.policies) == 0 {
		return false
	}
	pols := append(append([]ratePolicy(nil), info.policies...), lanePolicy(lane, d))
	primary := info.primary
	if primary < 0 {
		primary = len(pols) - 1
	}
	writeRateHeaders(h, pols, primary)
	return true
}

// Canonical header keys, so that setting them costs no canonicalization.
const (
	hdrLimit       = "X-Ratelimit-Limit"
	hdrRemaining   = "X-Ratelimit-Remaining"
	hdrReset       = "X-Ratelimit-Reset"
	hdrPolicy      = "Ratelimit-Policy"
	hdrRateLimit   = "Ratelimit"
	hdrContentType = "Content-Type"
)

// setRateHeadersQuoted is setRateHeaders with the lane already quoted
// (laneCache.quoted); withJSON also sets Content-Type: application/json.
// The values share one backing array: two allocations for six headers.
func setRateHeadersQuoted(h http.Header, quoted string, d admission.Decision, withJSON bool) {
	// The lane's rate as a whole count per window, exactly (20/s is
	// q=20;w=1), as lanePolicy writes it.
	count, window := wholeQuota(d.Limit.Rate)
	reset := int64(math.Ceil(d.Reset.Seconds()))
	var b [128]byte
	p := strconv.AppendInt(b[:0], int64(d.Limit.Burst), 10)
	nLimit := len(p)
	p = strconv.AppendInt(p, int64(d.Remaining), 10)
	nRemaining := len(p)
	p = strconv.AppendInt(p, reset, 10)
	nReset := len(p)
	p = append(p, quoted...)
	p = append(p, ";q="...)
	p = strconv.AppendInt(p, count, 10)
	p = append(p, ";w="...)
	p = strconv.AppendInt(p, window, 10)
	nPolicy := len(p)
	p = append(p, quoted...)
	p = append(p, ";r="...)
	p = strconv.AppendInt(p, int64(d.Remaining), 10)
	p = append(p, ";t="...)
	p = strconv.AppendInt(p, reset, 10)
	all := string(p)
	vals := make([]string, 6)
	vals[0], vals[1], vals[2] = all[:nLimit], all[nLimit:nRemaining], all[nRemaining:nReset]
	vals[3], vals[4] = all[nReset:nPolicy], all[nPolicy:]
	h[hdrLimit], h[hdrRemaining], h[hdrReset] = vals[0:1:1], vals[1:2:2], vals[2:3:3]
	h[hdrPolicy], h[hdrRateLimit] = vals[3:4:4], vals[4:5:5]
	if withJSON {
		vals[5] = "application/json"
		h[hdrContentType] = vals[5:6:6]
	}
}

// answerBufs holds buffers for the 202 answers.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// appendAccepted appends a as encoding/json would write it, newline
// included, without reflection.
func appendAccepted(b []byte, a api.Accepted) []byte {
	b = append(b, `{"id":`...)
	b = jsonenc.AppendString(b, a.ID)
	b = append(b, `,"lane":`...)
	b = jsonenc.AppendString(b, a.Lane)
	b = append(b, `,"state":`...)
	b = jsonenc.AppendString(b, string(a.State))
	b = append(b, `,"eta_ms":`...)
	b = strconv.AppendInt(b, a.ETAMillis, 10)
	if a.Duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	return append(b, "}\n"...)
}

// laneCache holds what intake computes once per lane: the quoted name of
// the rate-limit headers and the lane's HTTP submission counters.
type laneCache struct {
	quoted                      string
	admitted, queued, duplicate prometheus.Counter
}

func (c *laneCache) submitted(state api.JobState) prometheus.Counter {
	switch state {
	case api.StateAdmitted:
		return c.admitted
	case api.StateQueued:
		return c.queued
	}
	return c.duplicate
}

// laneCache returns the cache of a configured lane (name was found in the
// directory, so the set of names is bounded).
func (h *Handler) laneCache(name string) *laneCache {
	if c, ok := h.lanesSeen.Load(name); ok {
		return c.(*laneCache)
	}
	s := h.cfg.Metrics.Submitted
	c := &laneCache{quoted: strconv.Quote(name),
		admitted: s.WithLabelValues(name, string(api.StateAdmitted), "http"), queued: s.WithLabelValues(name, string(api.StateQueued), "http"),
		duplicate: s.WithLabelValues(name, "duplicate", "http")}
	v, _ := h.lanesSeen.LoadOrStore(name, c)
	return v.(*laneCache)
}

func validKey(lane, k string) error {
	if err := queue.ValidGivenID(lane, k); err != nil {
		return fmt.Errorf("Idempotency-Key: %w", err)
	}
	return nil
}

// callerOf names who made the request: the id of its API key, or
// "anonymous" (logs add the client IP).
func callerOf(r *http.Request) string {
	if id, ok := r.Context().Value(callerCtx{}).(string); ok {
		return id
	}
	return "anonymous"
}

// clientIP is the address the request came from: through a trusted proxy,
// the client's (resolveClientIP), else the socket peer's.
func clientIP(r *http.Request) string {
	if ip, ok := r.Context().Value(clientIPCtx{}).(string); ok {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// metricLane keeps metric labels bounded: unknown lane names share one label.
func metricLane(d Directory, name string) string {
	if _, ok := d.Lane(name); ok {
		return name
	}
	return metrics.UnknownLane
}

func (h *Handler) lanes(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	out := api.Lanes{Lanes: h.cfg.Lanes.Status(ctx)}
	if cs := h.callers.Load(); cs != nil {
		for i := range out.Lanes {
			u := h.laneUtilization(out.Lanes[i].Name, out.Lanes[i].Rate)
			out.Lanes[i].CallerUtilization = &u
		}
		out.Plans = h.planStatus(cs)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (h *Handler) ready(w http.ResponseWriter, r *http.Request) {
	if h.draining.Load() {
		writeError(w, r, refusal(ErrShuttingDown, "", "shutting down"))
		return
	}
	if h.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := h.cfg.Ready(ctx); err != nil {
			writeError(w, r, err) // not ready: 503, retry in a second
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ready\n")
}
