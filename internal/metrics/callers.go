package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Caller quota layers, the layer label of the caller metrics.
const (
	LayerIP   = "ip"
	LayerPlan = "plan"
)

// NoPlan is the plan label of a refusal by the per-IP layer of a caller
// whose plan is not known (no key, an unknown key, a key without a plan).
const NoPlan = "none"

// callerLayers are the layer label values.
var callerLayers = []string{LayerIP, LayerPlan}

// Callers are the caller quota collectors (package quota, through ingest).
type Callers struct {
	// Rejections counts requests a caller quota refused, by lane, plan
	// and layer (never by key or IP: unbounded).
	Rejections *prometheus.CounterVec
	// Observed counts the refusals an observed (observe: true) plan, lane
	// or per-IP layer would have made, by lane, plan and layer.
	Observed *prometheus.CounterVec
	// Fallbacks counts checks answered from this instance's memory
	// because Redis could not be asked.
	Fallbacks prometheus.Counter

	planUtil, laneUtil *prometheus.Desc
	mu                 sync.Mutex
	read               func() (plans, lanes map[string]float64)
}

// Watch makes read, called at every gather, give the utilization of each
// plan and lane over the last minute.
func (c *Callers) Watch(read func() (plans, lanes map[string]float64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = read
}

// newCallers creates the caller quota collectors on reg.
func newCallers(reg prometheus.Registerer) *Callers {
	labels := []string{"lane", "plan", "layer"}
	c := &Callers{
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_caller_rejections_total", Help: "Requests refused (429) by a caller quota, by lane, plan and layer (ip, plan).",
		}, labels),
		Observed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_caller_observed_rejections_total", Help: "Refusals an observed caller quota (observe: true) would have made, by lane, plan and layer; nothing was refused.",
		}, labels),
		Fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "throttler_caller_quota_fallbacks_total", Help: "Caller quota checks answered from this instance's memory because Redis could not be asked (fail open per instance).",
		}),
		planUtil: prometheus.NewDesc("throttler_caller_plan_utilization",
			"Tokens the plan's callers took on this instance over the last minute, divided by what the plan allows the callers active in it.", []string{"plan"}, nil),
		laneUtil: prometheus.NewDesc("throttler_caller_lane_utilization",
			"Jobs callers submitted to the lane on this instance over the last minute, divided by what the lane's rate drains in it.", []string{"lane"}, nil),
	}
	reg.MustRegister(c.Rejections, c.Observed, c.Fallbacks, c)
	return c
}

// Init makes every series of lanes × plans exist at 0 (see InitLane), the
// unknown lane's and the IP layer's "none" plan included.
func (c *Callers) Init(lanes, plans []string) {
	lanes = append(append([]string(nil), lanes...), UnknownLane)
	plans = append(append([]string(nil), plans...), NoPlan)
	for _, l := range lanes {
		for _, p := range plans {
			for _, layer := range callerLayers {
				c.Rejections.WithLabelValues(l, p, layer)
				c.Observed.WithLabelValues(l, p, layer)
			}
		}
	}
}

// Describe implements prometheus.Collector.
func (c *Callers) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.planUtil
	ch <- c.laneUtil
}

// Collect implements prometheus.Collector.
func (c *Callers) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	read := c.read
	c.mu.Unlock()
	if read == nil {
		return
	}
	plans, lanes := read()
	for p, v := range plans {
		ch <- prometheus.MustNewConstMetric(c.planUtil, prometheus.GaugeValue, v, p)
	}
	for l, v := range lanes {
		ch <- prometheus.MustNewConstMetric(c.laneUtil, prometheus.GaugeValue, v, l)
	}
}
