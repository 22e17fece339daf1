package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/api"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/queue"
)

// DeadLetters is the dead-letter store the admin endpoints work on.
type DeadLetters interface {
	// ListDeadPage lists a page; NextAfter is set when the page is full
	// or was cut short with dead letters left after it.
	ListDeadPage(ctx context.Context, lane string, after uint64, limit int) (api.DeadLetters, error)
	GetDead(ctx context.Context, lane string, seq uint64) (api.DeadLetter, error)
	ReplayDead(ctx context.Context, lane string, seq uint64, opt queue.ReplayOptions) (api.DeadLetter, error)
	ReplayAllDead(ctx context.Context, lane string, max int, until uint64) (queue.Replayed, error)
	DeleteDead(ctx context.Context, lane string, seq uint64) error
	PurgeDead(ctx context.Context, lane string) error
}

// Bounds of the dead-letter listing and of one replay-all call.
const (
	defaultDeadPage = 100
	maxDeadPage     = 1000
	maxReplayAll    = 100_000
)

// ProblemBadQuery is the problem type for a bad query or path parameter.
const ProblemBadQuery = "urn:throttler:problem:invalid-parameter"

func (h *Handler) routeAdmin() {
	if h.cfg.DeadLetters == nil {
		return
	}
	// Listing shows no payloads: read. One dead letter (its payload) and
	// every change: admin.
	h.mux.HandleFunc("GET /v1/lanes/{lane}/dead", h.authorize(needRead, h.admin(h.listDead)))
	h.mux.HandleFunc("DELETE /v1/lanes/{lane}/dead", h.authorize(needAdmin, h.admin(h.purgeDead)))
	h.mux.HandleFunc("POST /v1/lanes/{lane}/dead/replay", h.authorize(needAdmin, h.admin(h.replayAll)))
	h.mux.HandleFunc("GET /v1/lanes/{lane}/dead/{seq}", h.authorize(needAdmin, h.admin(h.getDead)))
	h.mux.HandleFunc("DELETE /v1/lanes/{lane}/dead/{seq}", h.authorize(needAdmin, h.admin(h.deleteDead)))
	h.mux.HandleFunc("POST /v1/lanes/{lane}/dead/{seq}/replay", h.authorize(needAdmin, h.admin(h.replayOne)))
}

// audit logs an admin action: who (key id, or anonymous, and the client
// IP), on which lane, and what changed.
func (h *Handler) audit(r *http.Request, msg, action, lane string, attrs ...any) {
	h.cfg.Logger.Info(msg, append([]any{"audit", action, "caller", callerOf(r), "ip", clientIP(r), "lane", lane}, attrs...)...)
}

// admin checks the lane and answers the error f returns with its problem
// (problemFor): the refusal f made, or a store's error as it came.
func (h *Handler) admin(f func(w http.ResponseWriter, r *http.Request, lane string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		lane := r.PathValue("lane")
		if _, ok := h.cfg.Lanes.Lane(lane); !ok {
			p := problemFor(refusal(ErrUnknownLane, "", "no lane named %q is configured", clip(lane)))
			p.Lane = lane
			writeProblem(w, r, p, 0)
			return
		}
		if err := f(w, r, lane); err != nil {
			p := problemFor(err)
			p.Lane = lane
			writeProblem(w, r, p, time.Duration(p.RetryAfterSeconds)*time.Second)
		}
	}
}

func seqParam(r *http.Request) (uint64, error) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		return 0, refusal(ErrBadParam, "seq", "%q is not a dead-letter sequence number", clip(r.PathValue("seq")))
	}
	return seq, nil
}

// writeJSON answers v as JSON. No cache keeps it: these answers are one
// caller's view (a job's record may hold its target's answer, a key's
// status its limits), and a shared cache must not serve them to another.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (h *Handler) listDead(w http.ResponseWriter, r *http.Request, lane string) error {
	q := r.URL.Query()
	limit := defaultDeadPage
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxDeadPage {
			return refusal(ErrBadParam, "limit", "limit must be a whole number from 1 to %d", maxDeadPage)
		}
		limit = n
	}
	var after uint64
	if s := q.Get("after"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return refusal(ErrBadParam, "after", "after must be a dead-letter sequence number")
		}
		after = n
	}
	out, err := h.cfg.DeadLetters.ListDeadPage(r.Context(), lane, after, limit)
	if err != nil {
		return err
	}
	for i := range out.Dead {
		// A read-only key sees the listing: a query may hold a
		// credential (?api_key=…); GET of one (admin) shows it whole.
		out.Dead[i].Path, out.Dead[i].URL = hideQuery(out.Dead[i].Path), hideQuery(out.Dead[i].URL)
	}
	if out.Dead == nil {
		out.Dead = []api.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getDead(w http.ResponseWriter, r *http.Request, lane string) error {
	seq, err := seqParam(r)
	if err != nil {
		return err
	}
	d, err := h.cfg.DeadLetters.GetDead(r.Context(), lane, seq)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// replayOne replays one dead letter; ?key= gives the job its key (one
// dead-lettered without a key on a keyed lane, or with one the lane
// refuses), checked as a submission's Throttle-Key is.
func (h *Handler) replayOne(w http.ResponseWriter, r *http.Request, lane string) error {
	seq, err := seqParam(r)
	if err != nil {
		return err
	}
	var opt queue.ReplayOptions
	if q := r.URL.Query(); q.Has("key") {
		if err := queue.ValidKey(q.Get("key")); err != nil {
			return &Refusal{Err: ErrBadParam, Cause: err, Field: "key", Detail: "key: " + err.Error()}
		}
		opt.Key = q.Get("key")
	}
	d, err := h.cfg.DeadLetters.ReplayDead(r.Context(), lane, seq, opt)
	if err != nil {
		return replayRefusal(err)
	}
	h.audit(r, "dead letter replayed", "replay", lane, "seq", seq, "id", d.ID, "key", d.Key)
	out := map[string]any{"replayed": 1, "id": d.ID}
	if d.Key != "" {
		out["key"] = d.Key
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// replayRefusal is a replay's error as the API answers it: a dead letter
// that could never be delivered says why and what to do.
func replayRefusal(err error) error {
	var ue *queue.UndeliverableError
	if !errors.As(err, &ue) {
		return err
	}
	if ue.Given {
		return refusalOf(err, "dead letter %d (job %s) was not replayed: %s; give a key the lane takes, or leave key out", ue.Seq, ue.ID, ue.Reason)
	}
	return refusalOf(err, "dead letter %d (job %s) was not replayed, it could never be delivered: %s; replay it with its key (?key=), or delete it", ue.Seq, ue.ID, ue.Reason)
}

func (h *Handler) replayAll(w http.ResponseWriter, r *http.Request, lane string) error {
	limit := maxReplayAll
	if s := r.URL.Query().Get("max"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxReplayAll {
			return refusal(ErrBadParam, "max", "max must be a whole number from 1 to %d", maxReplayAll)
		}
		limit = n
	}
	var until uint64
	if s := r.URL.Query().Get("until"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n < 1 {
			return refusal(ErrBadParam, "until", "until must be a dead-letter sequence number (1 or more)")
		}
		until = n
	}
	n, err := h.cfg.DeadLetters.ReplayAllDead(r.Context(), lane, limit, until)
	if err != nil {
		return refusalOf(err, "replayed %d, then: %v", n.Replayed, err)
	}
	h.audit(r, "dead letters replayed", "replay_all", lane, "count", n.Replayed, "expired", n.Expired, "undeliverable", n.Undeliverable)
	out := map[string]any{"replayed": n.Replayed, "until": n.Until}
	if n.Expired > 0 {
		out["expired"] = n.Expired
	}
	if n.Undeliverable > 0 {
		out["undeliverable"] = n.Undeliverable
		out["undeliverable_seqs"] = n.UndeliverableSeqs
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) deleteDead(w http.ResponseWriter, r *http.Request, lane string) error {
	seq, err := seqParam(r)
	if err != nil {
		return err
	}
	if err := h.cfg.DeadLetters.DeleteDead(r.Context(), lane, seq); err != nil {
		return err
	}
	h.audit(r, "dead letter deleted", "delete", lane, "seq", seq)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) purgeDead(w http.ResponseWriter, r *http.Request, lane string) error {
	if err := h.cfg.DeadLetters.PurgeDead(r.Context(), lane); err != nil {
		return err
	}
	h.audit(r, "dead letters purged", "purge", lane)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// limitChange is the body of PATCH /v1/lanes/{lane}; absent fields keep
// their value. rate is a string ("50/s", "120/min") or a number of jobs per
// second, read by bucket.ParseRate.
type limitChange struct {
	Rate  *bucket.Rate `json:"rate"`
	Burst *int         `json:"burst"`
	// Paused holds (true) or releases (false) the lane (lanepause.go).
	Paused *bool `json:"paused"`
}

func (h *Handler) setLimit(w http.ResponseWriter, r *http.Request, lane string) error {
	var c limitChange
	if err := h.readSmall(w, r, &c, "a JSON object with rate, burst and/or paused"); err != nil {
		return err
	}
	if c.Rate == nil && c.Burst == nil && c.Paused != nil {
		return h.setPaused(w, r, lane, *c.Paused)
	}
	if c.Paused != nil {
		// One change at a time: a limit stored and a pause refused (or
		// the other way round) would be half-written.
		return refusal(ErrBadBody, "paused", "give paused alone, without rate or burst")
	}
	cur, _ := h.cfg.Lanes.Lane(lane)
	lim := cur.Admission.Limit
	if c.Rate != nil {
		lim.Rate = c.Rate.PerSecond()
	}
	if c.Burst != nil {
		lim.Burst = *c.Burst
	}
	if c.Rate == nil && c.Burst == nil {
		return refusal(ErrBadBody, "body", "nothing to change: give rate and/or burst, or paused")
	}
	if err := lim.Validate(); err != nil {
		// The field the error names, unless the body left it out: then the
		// change that made the pair unusable.
		field := "rate"
		var le *bucket.LimitError
		if errors.As(err, &le) && le.Field == "burst" && c.Burst != nil {
			field = "burst"
		}
		return &Refusal{Err: err, Field: field}
	}
	st, err := h.cfg.Lanes.SetLimit(r.Context(), lane, lim.Rate, lim.Burst)
	if err != nil {
		return err
	}
	h.audit(r, "lane limit changed", "set_limit", lane, "old_rate", cur.Admission.Limit.Rate, "old_burst", cur.Admission.Limit.Burst,
		"rate", lim.Rate, "burst", lim.Burst)
	writeJSON(w, http.StatusOK, st)
	return nil
}

// hideQuery is a job's path or URL with its query replaced by "…", as the
// dead-letter listing shows it.
func hideQuery(s string) string {
	if i := strings.IndexByte(s, '?'); i >= 0 {
		return s[:i+1] + "…"
	}
	return s
}
