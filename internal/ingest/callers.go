package ingest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/quota"
)

// Problem types of the caller quotas; docs/API.md documents each.
const (
	// ProblemCallerQuota: the caller is over its per-IP limit or its
	// plan (429 + Retry-After).
	ProblemCallerQuota = "urn:throttler:problem:caller-quota"
	// ProblemOverPlan: the request costs more tokens than the plan's burst:
	// no wait makes it fit (413).
	ProblemOverPlan = "urn:throttler:problem:over-plan"
)

// Callers configures the caller quotas (package quota): a per-IP layer
// checked before the caller's key is looked at, and a token bucket per
// caller from its plan. Limits protect the throttler and its tenants; a
// caller over them gets 429, while lane limits queue.
type Callers struct {
	// Limiter keeps the state of both layers (quota.Failover over Redis,
	// or quota.Memory).
	Limiter quota.Limiter
	// Lanes names every lane, for series at 0 from the start.
	Lanes []string
	// Clock is the clock of the utilization figures (only Now is used);
	// nil: clock.Real.
	Clock clock.Clock
	// Policy is what SetCallers may change later.
	Policy CallerPolicy
}

// CallerPolicy is the part of the caller quotas a reload or the admin API
// changes while the service runs.
type CallerPolicy struct {
	// PerIP is the per-IP layer (Limit 0: off); ObserveIP only logs and
	// counts its refusals.
	PerIP     quota.Window
	ObserveIP bool
	// TrustedProxies are the networks whose X-Forwarded-For and Forwarded
	// headers are believed (rightmost untrusted hop).
	TrustedProxies []netip.Prefix
	// Plans by name.
	Plans map[string]Plan
	// AnonymousPlan is the plan anonymous callers share, a bucket per
	// client IP (an IPv6 /64).
	AnonymousPlan string
	// DefaultPlan is the plan of a key that names none; "": none.
	DefaultPlan string
}

// Plan is one caller plan.
type Plan struct {
	// Rate as written ("10/min"), for the headers; Burst tokens at once.
	Rate  bucket.Rate
	Burst int
	// Observe computes, logs and counts refusals without enforcing them.
	Observe bool
}

func (p Plan) limit() bucket.Limit { return bucket.Limit{Rate: p.Rate.PerSecond(), Burst: p.Burst} }

// callerSet is one immutable generation of the policy, with the key→plan
// changes made through the admin API since.
type callerSet struct {
	CallerPolicy
	keyPlans map[string]string
}

func (s *callerSet) planOf(k *Key) string {
	if p, ok := s.keyPlans[k.ID]; ok {
		return p
	}
	if k.Plan != "" {
		return k.Plan
	}
	return s.DefaultPlan
}

// SetCallers replaces the caller policy at once (a reload): the next
// request sees it. Plans set through the admin API are dropped, the
// file's stand. It fails when the handler was built without caller quotas.
func (h *Handler) SetCallers(p CallerPolicy) error {
	if h.cfg.Callers == nil {
		return errors.New("ingest: caller quotas are off (no callers section at start)")
	}
	h.callers.Store(&callerSet{CallerPolicy: p})
	h.initCallerMetrics(p)
	return nil
}

func (h *Handler) initCallerMetrics(p CallerPolicy) {
	plans := make([]string, 0, len(p.Plans))
	for name := range p.Plans {
		plans = append(plans, name)
	}
	h.cfg.Metrics.Callers.Init(h.cfg.Callers.Lanes, plans)
}

func (h *Handler) now() time.Time {
	if h.cfg.Callers != nil && h.cfg.Callers.Clock != nil {
		return h.cfg.Callers.Clock.Now()
	}
	return clock.Real.Now()
}

// callerInfo is what the caller quotas learnt of a request, for the
// headers of its answer and for a later charge (chargeJobs).
type callerInfo struct {
	ip     string // the client IP, as logged
	ipKey  string // the per-IP layer's key
	caller string // the plan layer's key: "key:<id>" or "ip:<ipKey>"
	plan   string // "" when no plan applies
	// policies are the caller's rate-limit policies; primary is the one
	// the X-RateLimit-* headers describe (-1: none).
	policies []ratePolicy
	primary  int
	// lane is the lane's state, read with the caller quotas in one round
	// trip (a single job of a lane that is not keyed); nil: admission
	// reads it.
	lane *admission.Peeked
}

type callerInfoCtx struct{}

type clientIPCtx struct{}

// guard wraps a route that needs n of its caller: it decides who asks (the
// key, without answering yet), checks the caller quotas (on a route that
// submits no job, only for a refused key), then answers in this order: 429 of the per-IP layer (whatever the key), 401 or 403, 429
// (or 413) of the caller's plan, the route. jobs is how many jobs the
// request submits: they are charged to the plan now at the lane's cost
// each; 0 for a route that charges itself once it knows (chargeJobs); -1
// for a route that submits none (only the per-IP layer applies).
func (h *Handler) guard(n need, jobs int, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if n == needNothing {
			next(w, r)
			return
		}
		set := h.keys.Load()
		var k *Key
		var refusal func()
		if set != nil {
			k, refusal = h.identify(w, r, set, n)
		}
		// Job routes count every request; other routes only those whose
		// key is refused (key guessing), so that polling with a valid key
		// (the status page) never runs into the per-IP limit.
		if cs := h.callers.Load(); cs != nil && (jobs >= 0 || refusal != nil) {
			var ok bool
			r, ok = h.checkCallers(w, r, cs, k, refusal == nil, jobs)
			if !ok {
				return
			}
		}
		if refusal != nil {
			refusal()
			return
		}
		if k != nil {
			ctx := context.WithValue(r.Context(), callerCtx{}, k.ID)
			r = r.WithContext(context.WithValue(ctx, scopesCtx{}, k.Scopes))
		}
		next(w, r)
	}
}

// ipKey is the per-IP layer's key of an address: the address, or its /64
// for IPv6 (one host usually holds a whole /64).
func ipKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// checkCallers checks both layers in one call to the limiter and answers a
// refusal itself (ok false). authorized says the key (k, or anonymous when
// k is nil) may call the route; an unauthorized request is only checked
// by the per-IP layer and answered by the caller.
func (h *Handler) checkCallers(w http.ResponseWriter, r *http.Request, cs *callerSet, k *Key, authorized bool, jobs int) (*http.Request, bool) {
	ip := clientIP(r)
	info := &callerInfo{ip: ip, ipKey: ipKey(ip), primary: -1}
	laneName := r.PathValue("lane")
	lane, known := Lane{}, false
	if jobs >= 0 {
		lane, known = h.cfg.Lanes.Lane(laneName)
	}
	cost := max(lane.Cost, 1)
	observeLane := known && lane.Observe
	req := quota.Request{PerIP: cs.PerIP, ObserveIP: cs.ObserveIP || observeLane}
	if cs.PerIP.On() {
		req.IP = info.ipKey
	}
	var plan Plan
	if jobs >= 0 && authorized {
		if k != nil {
			info.plan = cs.planOf(k)
			info.caller = "key:" + k.ID
		} else {
			info.plan = cs.AnonymousPlan
			info.caller = "ip:" + info.ipKey
		}
		p, ok := cs.Plans[info.plan]
		if !ok {
			info.plan, info.caller = "", ""
		} else {
			plan = p
			req.Caller, req.Plan, req.Cost = info.caller, p.limit(), cost*max(jobs, 0)
		}
	}
	if jobs == 1 && authorized && known && lane.Admission.KeyLimit == nil {
		// One job of a lane that is not keyed: the lane's decision needs
		// only its state, which the limiter may read in the same round
		// trip (redisquota on a client that is not Redis Cluster).
		req.Lane, req.LaneLimit = bucket.Key{Lane: lane.Admission.Name}, lane.Admission.Limit
	}
	overBurst := req.Caller != "" && req.Cost > req.Plan.Burst
	if overBurst {
		req.Cost = 0 // read the plan's state for the headers; refused below
	}
	res, err := h.cfg.Callers.Limiter.Check(r.Context(), req)
	if err != nil {
		h.cfg.Logger.Error("caller quota check failed; the request goes on unchecked", "ip", ip, "lane", clip(laneName), "err", err)
		return r.WithContext(context.WithValue(r.Context(), callerInfoCtx{}, info)), true
	}
	if res.LaneChecked {
		info.lane = &admission.Peeked{D: res.Lane, At: time.Now()}
	}
	if res.IPChecked {
		info.policies = append(info.policies, ipPolicy(cs.PerIP, res.IP))
	}
	if res.PlanChecked {
		info.policies = append(info.policies, planPolicy(info.plan, plan, res.Plan))
		info.primary = len(info.policies) - 1
	} else if res.IPChecked {
		info.primary = 0
	}
	r = r.WithContext(context.WithValue(r.Context(), callerInfoCtx{}, info))
	mlane := metricLane(h.cfg.Lanes, laneName)
	if jobs < 0 {
		mlane = metricLane(h.cfg.Lanes, "")
	}
	who := "anonymous"
	if k != nil && authorized {
		who = k.ID
	}
	planLabel := info.plan
	if planLabel == "" {
		planLabel = metrics.NoPlan
	}
	q := quotaCase{who: who, info: info, plan: planLabel, lane: laneName, mlane: mlane}
	if res.IPChecked && !res.IP.Allowed {
		q.layer, q.field, q.retry = metrics.LayerIP, "per_ip", res.IP.RetryAfter
		if req.ObserveIP {
			h.observed(r, q)
		} else {
			info.primary = 0
			writeRateHeaders(w.Header(), info.policies, 0)
			h.quotaRefuse(w, r, q, fmt.Sprintf("client IP %s made %d requests in the last %v, over its per-IP limit; retry after Retry-After", ip, cs.PerIP.Limit, cs.PerIP.Length))
			return r, false
		}
	}
	writeRateHeaders(w.Header(), info.policies, info.primary)
	if !authorized {
		return r, true // the caller answers 401 or 403
	}
	if overBurst {
		h.overPlan(w, r, q, cost*jobs, plan)
		return r, false
	}
	if res.PlanChecked && !res.Plan.Allowed {
		q.layer, q.field, q.retry = metrics.LayerPlan, "plan", res.Plan.RetryAfter
		if plan.Observe || observeLane {
			h.observed(r, q)
		} else {
			h.quotaRefuse(w, r, q, fmt.Sprintf("the caller is over its plan %s (%s, burst %d); retry after Retry-After", info.plan, plan.Rate, plan.Burst))
			return r, false
		}
	}
	if res.PlanChecked && res.Plan.Allowed && req.Cost > 0 {
		h.used(info, laneName, known, float64(req.Cost), jobs)
	}
	return r, true
}

// used records the tokens a caller took, for the utilization figures.
func (h *Handler) used(info *callerInfo, lane string, known bool, tokens float64, jobs int) {
	now := h.now()
	h.usage.Add("plan:"+info.plan, info.caller, tokens, now)
	if known {
		h.usage.Add("lane:"+lane, "", float64(jobs), now)
	}
}

// chargeJobs charges n jobs of lane, at the lane's cost each, to the plan
// of the caller that guard let in with jobs 0 (a batch, whose size is
// known once its body is read). It reports whether the request may go on;
// on false it has answered 429 or 413. Without caller quotas, or without
// a plan for the caller, it charges nothing.
func (h *Handler) chargeJobs(w http.ResponseWriter, r *http.Request, lane Lane, n int) bool {
	cs := h.callers.Load()
	info, _ := r.Context().Value(callerInfoCtx{}).(*callerInfo)
	if cs == nil || info == nil || info.plan == "" || n <= 0 {
		return true
	}
	plan, ok := cs.Plans[info.plan]
	if !ok {
		return true
	}
	name := lane.Admission.Name
	mlane := metricLane(h.cfg.Lanes, name)
	who := callerOf(r)
	cost := max(lane.Cost, 1) * n
	q := quotaCase{who: who, info: info, plan: info.plan, lane: name, mlane: mlane}
	if cost > plan.Burst {
		h.overPlan(w, r, q, cost, plan)
		return false
	}
	res, err := h.cfg.Callers.Limiter.Check(r.Context(), quota.Request{Caller: info.caller, Plan: plan.limit(), Cost: cost})
	if err != nil {
		h.cfg.Logger.Error("caller quota check failed; the request goes on unchecked", "ip", info.ip, "lane", name, "err", err)
		return true
	}
	pol := planPolicy(info.plan, plan, res.Plan)
	if i := slices.IndexFunc(info.policies, func(p ratePolicy) bool { return p.name == pol.name }); i >= 0 {
		info.policies[i] = pol
	} else {
		info.policies = append(info.policies, pol)
		info.primary = len(info.policies) - 1
	}
	writeRateHeaders(w.Header(), info.policies, info.primary)
	if !res.Plan.Allowed {
		q.layer, q.field, q.retry = metrics.LayerPlan, "plan", res.Plan.RetryAfter
		if plan.Observe || lane.Observe {
			h.observed(r, q)
			return true
		}
		h.quotaRefuse(w, r, q, fmt.Sprintf("%d jobs cost %d tokens, more than the caller's plan %s (%s, burst %d) has now; retry after Retry-After", n, cost, info.plan, plan.Rate, plan.Burst))
		return false
	}
	h.used(info, name, true, float64(cost), n)
	return true
}

// quotaCase is one caller quota check that refused (or, observed, would
// have): who asked (a key id or anonymous), the caller's info, its plan's
// label, the lane as named in the path and as a metric label, and the
// layer that refused, its field and when to retry.
type quotaCase struct {
	who         string
	info        *callerInfo
	plan        string
	lane, mlane string
	layer       string
	field       string
	retry       time.Duration
}

// quotaRefuse answers 429 with detail, and logs and counts the refusal.
func (h *Handler) quotaRefuse(w http.ResponseWriter, r *http.Request, q quotaCase, detail string) {
	h.cfg.Logger.Warn("caller refused", "caller", q.who, "ip", q.info.ip, "plan", q.plan, "lane", clip(q.lane), "layer", q.layer,
		"reason", q.field+"_limit", "route", route(r), "retry_after", q.retry.String(), "at", h.now().UTC())
	h.cfg.Metrics.Callers.Rejections.WithLabelValues(q.mlane, q.plan, q.layer).Inc()
	p := problemFor(&Refusal{Err: ErrCallerQuota, Field: q.field, Detail: detail, RetryAfter: q.retry})
	p.Lane = q.lane
	writeProblem(w, r, p, q.retry)
}

// observed logs and counts a refusal an observed layer would have made.
func (h *Handler) observed(r *http.Request, q quotaCase) {
	h.cfg.Logger.Info("caller would be refused (observe)", "caller", q.who, "ip", q.info.ip, "plan", q.plan, "lane", clip(q.lane), "layer", q.layer,
		"reason", q.field+"_limit", "route", route(r), "retry_after", q.retry.String(), "at", h.now().UTC(), "observed", true)
	h.cfg.Metrics.Callers.Observed.WithLabelValues(q.mlane, q.plan, q.layer).Inc()
}

// overPlan answers 413: the request costs more than the plan's burst.
func (h *Handler) overPlan(w http.ResponseWriter, r *http.Request, q quotaCase, cost int, p Plan) {
	h.cfg.Logger.Warn("caller refused", "caller", q.who, "ip", q.info.ip, "plan", q.plan, "lane", clip(q.lane), "layer", metrics.LayerPlan,
		"reason", "cost_over_burst", "route", route(r), "cost", cost, "at", h.now().UTC())
	h.cfg.Metrics.Callers.Rejections.WithLabelValues(q.mlane, q.plan, metrics.LayerPlan).Inc()
	pr := problemFor(refusal(ErrOverPlan, "", "the request costs %d tokens, more than the burst of %d of plan %s: it can never fit; send fewer jobs at once", cost, p.Burst, q.plan))
	pr.Lane = q.lane
	writeProblem(w, r, pr, 0)
}

// ratePolicy is one rate-limit policy in the response headers: q per w
// seconds; r remaining now, t seconds until reset; limit is the
// X-RateLimit-Limit of the policy (a bucket's burst, a window's limit).
type ratePolicy struct {
	name  string
	q, w  int64
	r, t  int64
	limit int64
}

// ipPolicy is the per-IP layer's policy, "callers:ip".
func ipPolicy(win quota.Window, d quota.WindowDecision) ratePolicy {
	t := d.Reset
	if d.Remaining == 0 && d.RetryAfter > 0 {
		t = d.RetryAfter
	}
	return ratePolicy{name: "callers:ip", q: win.Limit, w: int64(win.Length / time.Second), r: d.Remaining, t: ceilSeconds(t), limit: win.Limit}
}

// planPolicy is a plan's policy, "plan:<name>": its rate as written (10/min
// is q=10;w=60), the bucket's tokens left and the seconds until it is full.
func planPolicy(name string, p Plan, d bucket.Decision) ratePolicy {
	count, window := p.Rate.Quota()
	return ratePolicy{name: "plan:" + name, q: int64(math.Floor(count)), w: max(int64(window/time.Second), 1),
		r: int64(d.Remaining), t: ceilSeconds(d.ResetAfter), limit: int64(p.Burst)}
}

// lanePolicy is a lane's policy, named after the lane: its rate as a whole
// count per whole-second window (20/s is q=20;w=1, 0.5/s is q=1;w=2).
func lanePolicy(lane string, d admission.Decision) ratePolicy {
	q, w := wholeQuota(d.Limit.Rate)
	return ratePolicy{name: lane, q: q, w: w, r: int64(d.Remaining), t: ceilSeconds(d.Reset), limit: int64(d.Limit.Burst)}
}

func ceilSeconds(d time.Duration) int64 { return max(int64(math.Ceil(d.Seconds())), 0) }

// wholeQuota writes rate (per second) as a whole count per whole number of
// seconds: the smallest window up to a day whose count is whole (to 1e-9),
// else the count per second rounded down (at least 1 per window).
func wholeQuota(rate float64) (q, w int64) {
	// Convergents of the continued fraction of rate give the smallest
	// denominators first.
	h0, h1 := int64(0), int64(1) // numerators
	k0, k1 := int64(1), int64(0) // denominators
	x := rate
	for range 40 {
		a := math.Floor(x)
		if a > math.MaxInt32 {
			break
		}
		ai := int64(a)
		h0, h1 = h1, ai*h1+h0
		k0, k1 = k1, ai*k1+k0
		if k1 > 86400 {
			break
		}
		if math.Abs(float64(h1)/float64(k1)-rate) <= 1e-9*rate {
			return h1, k1
		}
		if x-a < 1e-12 {
			break
		}
		x = 1 / (x - a)
	}
	if rate >= 1 {
		return int64(rate), 1
	}
	return 1, int64(math.Ceil(1 / rate))
}

// writeRateHeaders writes every policy in RateLimit-Policy and RateLimit
// (IETF draft, structured-field lists), and the primary one in
// X-RateLimit-Limit/Remaining/Reset.
func writeRateHeaders(h http.Header, pols []ratePolicy, primary int) {
	if len(pols) == 0 {
		return
	}
	var pol, rl []string
	for _, p := range pols {
		pol = append(pol, fmt.Sprintf("%q;q=%d;w=%d", p.name, p.q, p.w))
		rl = append(rl, fmt.Sprintf("%q;r=%d;t=%d", p.name, p.r, p.t))
	}
	h.Set("RateLimit-Policy", strings.Join(pol, ", "))
	h.Set("RateLimit", strings.Join(rl, ", "))
	if primary < 0 || primary >= len(pols) {
		primary = 0
	}
	p := pols[primary]
	h.Set("X-RateLimit-Limit", strconv.FormatInt(p.limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(p.r, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(p.t, 10))
}

// resolveClientIP finds the client's address: the socket peer, or, when
// the peer is a trusted proxy, the rightmost hop of Forwarded or
// X-Forwarded-For that is not a trusted proxy. A hop that does not parse
// ends the walk at the last trusted one. A proxy writes one of the two
// headers and passes the other on as its client sent it, so when both are
// present and name different clients the peer is the client: a caller
// cannot pick its address by sending the header its proxy does not write.
func resolveClientIP(r *http.Request, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || len(trusted) == 0 {
		return host
	}
	peer = peer.Unmap()
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if !isTrusted(peer) {
		return peer.String()
	}
	walk := func(hops []string) netip.Addr {
		client := peer
		for i := len(hops) - 1; i >= 0; i-- {
			a, ok := parseHop(hops[i])
			if !ok {
				break
			}
			client = a
			if !isTrusted(a) {
				break
			}
		}
		return client
	}
	fw, xff := r.Header.Values("Forwarded"), r.Header.Values("X-Forwarded-For")
	switch {
	case len(fw) > 0 && len(xff) > 0:
		if a, b := walk(forwardedHops(fw)), walk(xffHops(xff)); a == b {
			return a.String()
		}
		return peer.String()
	case len(fw) > 0:
		return walk(forwardedHops(fw)).String()
	default:
		return walk(xffHops(xff)).String()
	}
}

// maxHops is how many hops of a header are read (the last ones).
const maxHops = 64

// forwardedHops lists the for= parameters of Forwarded lines (RFC 7239),
// oldest first.
func forwardedHops(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, elem := range strings.Split(line, ",") {
			for _, pair := range strings.Split(elem, ";") {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(k, "for") {
					hops = append(hops, strings.Trim(v, `"`))
				}
			}
		}
	}
	return lastHops(hops)
}

// xffHops lists the addresses of X-Forwarded-For lines, oldest first.
func xffHops(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, h := range strings.Split(line, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	return lastHops(hops)
}

func lastHops(hops []string) []string {
	if len(hops) > maxHops {
		return hops[len(hops)-maxHops:]
	}
	return hops
}

// parseHop reads one hop: an address, with or without a port, IPv6 in
// brackets with a port.
func parseHop(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// planStatus lists the plans with their utilization over the last minute.
func (h *Handler) planStatus(cs *callerSet) []api.PlanStatus {
	now := h.now()
	names := make([]string, 0, len(cs.Plans))
	for name := range cs.Plans {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]api.PlanStatus, 0, len(names))
	for _, name := range names {
		p := cs.Plans[name]
		used, callers := h.usage.Used("plan:"+name, now)
		out = append(out, api.PlanStatus{Name: name, Rate: p.Rate.String(), Burst: p.Burst, Observe: p.Observe,
			Utilization: quota.Utilization(used, callers, p.Rate.PerSecond()), Callers: callers})
	}
	return out
}

// laneUtilization is the jobs callers submitted to lane over the last
// minute over what the lane's rate drains in it.
func (h *Handler) laneUtilization(lane string, rate float64) float64 {
	used, _ := h.usage.Used("lane:"+lane, h.now())
	return quota.Utilization(used, 1, rate)
}

// utilization is what /metrics shows of the plans and lanes.
func (h *Handler) utilization() (plans, lanes map[string]float64) {
	cs := h.callers.Load()
	if cs == nil {
		return nil, nil
	}
	plans, lanes = map[string]float64{}, map[string]float64{}
	for _, p := range h.planStatus(cs) {
		plans[p.Name] = p.Utilization
	}
	for _, name := range h.cfg.Callers.Lanes {
		if l, ok := h.cfg.Lanes.Lane(name); ok {
			lanes[name] = h.laneUtilization(name, l.Admission.Limit.Rate)
		}
	}
	return plans, lanes
}
