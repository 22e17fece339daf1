package ingest

import (
	"errors"
	"fmt"
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
	bad := func(field, detail string) {
		writeProblem(w, r, api.Problem{Type: ProblemBadBody, Status: http.StatusBadRequest, Field: field, Detail: detail}, 0)
	}
	if !quota.ValidPlanName(name) {
		writeProblem(w, r, api.Problem{Type: ProblemBadQuery, Status: http.StatusBadRequest, Field: "plan",
			Detail: fmt.Sprintf("%q must be 1-64 letters, digits, '_' or '-'", clip(name))}, 0)
		return
	}
	var c planChange
	if p := h.decodeSmall(w, r, &c, "a JSON object"); p != nil {
		writeProblem(w, r, *p, 0)
		return
	}
	if c.Rate == nil || c.Rate.IsZero() {
		bad("rate", "rate is required: a rate like 10/min, 1200/min or 5/s")
		return
	}
	p := Plan{Rate: *c.Rate, Burst: c.Burst, Observe: c.Observe}
	if p.Burst == 0 {
		n, _ := p.Rate.Quota()
		p.Burst = max(int(n), 1)
	}
	if err := p.limit().Validate(); err != nil {
		field := "rate"
		var le *bucket.LimitError
		if errors.As(err, &le) {
			field = le.Field
		}
		bad(field, err.Error())
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
		writeProblem(w, r, api.Problem{Type: ProblemNotFound, Status: http.StatusNotFound, Field: "key",
			Detail: fmt.Sprintf("no API key with id %q", clip(id))}, 0)
		return
	}
	var c keyPlanChange
	if p := h.decodeSmall(w, r, &c, "a JSON object"); p != nil {
		writeProblem(w, r, *p, 0)
		return
	}
	if c.Plan == nil {
		writeProblem(w, r, api.Problem{Type: ProblemBadBody, Status: http.StatusBadRequest, Field: "plan", Detail: `plan is required: {"plan": "<name>"}`}, 0)
		return
	}
	var old string
	for {
		cur := h.callers.Load()
		if _, ok := cur.Plans[*c.Plan]; !ok {
			writeProblem(w, r, api.Problem{Type: ProblemBadBody, Status: http.StatusBadRequest, Field: "plan",
				Detail: fmt.Sprintf("no plan named %q", clip(*c.Plan))}, 0)
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
