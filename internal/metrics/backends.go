package metrics

import "github.com/prometheus/client_golang/prometheus"

// Backends are the health gauges of the services the throttler depends
// on (NATS, Redis), set by a bounded probe (backend.Probe).
type Backends struct {
	// Up is 1 while the last probe of the backend answered, else 0.
	Up *prometheus.GaugeVec
	// RTT is the round trip of the last probe that answered, in seconds.
	RTT *prometheus.GaugeVec
	// Probes counts probes by backend and result (ok, error).
	Probes *prometheus.CounterVec
}

// Backend names: the label values of Backends.
const (
	BackendNATS  = "nats"
	BackendRedis = "redis"
)

func newBackends(reg prometheus.Registerer) *Backends {
	b := &Backends{
		Up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttler_backend_up",
			Help: "1 while the last health probe of the backend (nats, redis) answered in time, else 0.",
		}, []string{"backend"}),
		RTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttler_backend_rtt_seconds",
			Help: "Round trip of the last health probe of the backend (nats, redis) that answered, in seconds.",
		}, []string{"backend"}),
		Probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_backend_probes_total",
			Help: "Health probes of the backends, by backend and result (ok, error).",
		}, []string{"backend", "result"}),
	}
	reg.MustRegister(b.Up, b.RTT, b.Probes)
	return b
}

// InitBackend makes backend's series exist: down (0) until a probe
// answers, and both probe counters at 0.
func (b *Backends) InitBackend(backend string) {
	b.Up.WithLabelValues(backend).Set(0)
	b.RTT.WithLabelValues(backend)
	b.Probes.WithLabelValues(backend, "ok")
	b.Probes.WithLabelValues(backend, "error")
}
