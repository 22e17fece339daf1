package ingest

import (
	"net/http"
	"slices"

	"github.com/throttler/throttler/internal/metrics"
)

// router is the handler's http.ServeMux, remembering each pattern it
// registers so that the API description (docs/openapi.yaml) can be checked
// against the routes that really exist. Register routes on it like on a
// ServeMux; it is not safe for concurrent registration (New registers all).
type router struct {
	*http.ServeMux
	patterns []string
	// metrics, when set, counts each route's requests under its pattern
	// (httpmetrics.go).
	metrics *metrics.HTTP
}

func newRouter(m *metrics.HTTP) *router { return &router{ServeMux: http.NewServeMux(), metrics: m} }

// Handle registers h for pattern (http.ServeMux syntax: "GET /v1/lanes").
func (r *router) Handle(pattern string, h http.Handler) {
	r.ServeMux.Handle(pattern, instrumented(r.metrics, pattern, h))
	r.patterns = append(r.patterns, pattern)
}

// HandleFunc registers f for pattern.
func (r *router) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	r.Handle(pattern, http.HandlerFunc(f))
}

// routes lists the patterns the handler serves, as registered
// ("GET /v1/lanes", "POST /v1/lanes/{lane}/jobs", "/" for the not-found
// answer), sorted.
func (h *Handler) routes() []string {
	out := slices.Clone(h.mux.patterns)
	slices.Sort(out)
	return out
}
