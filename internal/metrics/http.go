package metrics

import "github.com/prometheus/client_golang/prometheus"

// HTTP are the collectors of the API's own requests. Labels are the route
// template (never the raw path: lane names and job ids would make the
// series unbounded), the method and the status code.
type HTTP struct {
	// Requests counts answered requests by method, route and code.
	Requests *prometheus.CounterVec
	// Seconds is the time from the request's routing to its last byte
	// written, by method and route.
	Seconds *prometheus.HistogramVec
	// Inflight is the requests being served now.
	Inflight prometheus.Gauge
}

// UnmatchedRoute is the route label of requests no route matched (the
// not-found answer).
const UnmatchedRoute = "unmatched"

func newHTTP(reg prometheus.Registerer) *HTTP {
	h := &HTTP{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "throttler_http_requests_total",
			Help: "API requests answered, by method, route template and status code.",
		}, []string{"method", "route", "code"}),
		Seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "throttler_http_request_duration_seconds",
			Help: "Time the API took to answer a request, by method and route template.",
			// 0.5 ms to 16 s: a submission answers in about a millisecond,
			// one that waits for its slot (admit_wait) or a dead-letter
			// replay takes seconds.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"method", "route"}),
		Inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "throttler_http_requests_inflight",
			Help: "API requests being served now.",
		}),
	}
	reg.MustRegister(h.Requests, h.Seconds, h.Inflight)
	return h
}
