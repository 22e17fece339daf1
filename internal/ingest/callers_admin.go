package ingest

import (
	"maps"
	"net/http"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/quota"
)

// routeCallers adds the caller plan endpoints when caller quotas are on.
// Changes hold on this instance until the next reload (SIGHUP) or restart;
// the config file and keys_file hold the lasting values.
func (h *Handler) routeCallers() {
	if h.cfg.Callers == nil {
		return
	}
	h.mux.HandleFunc("GET /v1/callers/plans", h.authorize(needRead, h.getPlans))
	h.mux.HandleFunc("PUT /v1/callers/plans/{plan}", h.authorize(needAdmin, h.putPlan))
	h.mux.HandleFunc("PUT /v1/callers/keys/{key}/plan", h.authorize(needAdmin, h.putKeyPlan))
}

func (h *Handler) getPlans(w http.ResponseWriter, _ *http.Request) {
	cs := h.callers.Load()
	writeJSON(w, http.StatusOK, h.plansBody(cs))
}

func (h *Handler) plansBody(cs *callerSet) api.Plans {
	return api.Plans{Plans: h.planStatus(cs), AnonymousPlan: cs.AnonymousPlan, DefaultPlan: cs.DefaultPlan, KeyPlans: cs.keyPlans,
		PerIP: api.PerIP{Limit: cs.PerIP.Limit, WindowSeconds: int64(cs.PerIP.Length / time.Second), Observe: cs.ObserveIP}}
}

// planChange is the body of PUT /v1/callers/plans/{plan}.
type planChange struct {
	Rate    *bucket.Rate `json:"rate"`
	Burst   int          `json:"burst"`
	Observe bool         `json:"observe"`
}

func (h *Handler) putPlan(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("plan")
	if !quota.ValidPlanName(name) {
		writeError(w, r, refusal(ErrBadParam, "plan", "%q must be 1-64 letters, digits, '_' or '-'", clip(name)))
		return
	}
	var c planChange
	if p := h.decodeSmall(w, r, &c, "a JSON object"); p != nil {
		writeProblem(w, r, *p, time.Duration(p.RetryAfterSeconds)*time.Second)
		return
	}
	if c.Rate == nil || c.Rate.IsZero() {
		writeError(w, r, refusal(ErrBadBody, "rate", "rate is required: a rate like 10/min, 1200/min or 5/s"))
		return
	}
	p := Plan{Rate: *c.Rate, Burst: c.Burst, Observe: c.Observe}
	if p.Burst == 0 {
		n, _ := p.Rate.Quota()
		p.Burst = max(int(n), 1)
	}
	if err := p.limit().Validate(); err != nil {
		writeError(w, r, err) // a *bucket.LimitError names its field
		return
	}
	var old Plan
	var existed bool
	for {
		cur := h.callers.Load()
		next := *cur
		next.Plans = maps.Clone(cur.Plans)
		old, existed = next.Plans[name]
		next.Plans[name] = p
		if h.callers.CompareAndSwap(cur, &next) {
			break
		}
	}
	if !existed {
		h.cfg.Metrics.Callers.Init(h.cfg.Callers.Lanes, []string{name})
	}
	h.audit(r, "caller plan set", "set_plan", "", "plan", name, "existed", existed, "old_rate", old.Rate.String(), "old_burst", old.Burst,
		"rate", p.Rate.String(), "burst", p.Burst, "observe", p.Observe)
	writeJSON(w, http.StatusOK, api.PlanStatus{Name: name, Rate: p.Rate.String(), Burst: p.Burst, Observe: p.Observe})
}

// keyPlanChange is the body of PUT /v1/callers/keys/{key}/plan.
type keyPlanChange struct {
	Plan *string `json:"plan"`
}

func (h *Handler) putKeyPlan(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("key")
	set := h.keys.Load()
	var key *Key
	if set != nil {
		for i := range set.keys {
			if set.keys[i].ID == id {
				key = &set.keys[i]
			}
		}
	}
	if key == nil {
		writeError(w, r, refusal(ErrNotFound, "key", "no API key with id %q", clip(id)))
		return
	}
	var c keyPlanChange
	if p := h.decodeSmall(w, r, &c, "a JSON object"); p != nil {
		writeProblem(w, r, *p, time.Duration(p.RetryAfterSeconds)*time.Second)
		return
	}
	if c.Plan == nil {
		writeError(w, r, refusal(ErrBadBody, "plan", `plan is required: {"plan": "<name>"}`))
		return
	}
	var old string
	for {
		cur := h.callers.Load()
		if _, ok := cur.Plans[*c.Plan]; !ok {
			writeError(w, r, refusal(ErrBadBody, "plan", "no plan named %q", clip(*c.Plan)))
			return
		}
		next := *cur
		next.keyPlans = maps.Clone(cur.keyPlans)
		if next.keyPlans == nil {
			next.keyPlans = map[string]string{}
		}
		old = cur.planOf(key)
		next.keyPlans[id] = *c.Plan
		if h.callers.CompareAndSwap(cur, &next) {
			break
		}
	}
	h.audit(r, "key plan set", "set_key_plan", "", "key", id, "old_plan", old, "plan", *c.Plan)
	writeJSON(w, http.StatusOK, map[string]string{"key": id, "plan": *c.Plan})
}
