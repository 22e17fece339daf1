package ingest

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/metrics"
)

// instrumented wraps the handler of one route pattern with the API's
// request metrics (metrics.HTTP). The labels come from the pattern as
// registered ("POST /v1/lanes/{lane}/jobs": method POST, route
// /v1/lanes/{lane}/jobs), never from the request's path; the catch-all
// "/" counts as metrics.UnmatchedRoute with the request's method when it
// is a standard one (a client's made-up methods would be unbounded).
func instrumented(m *metrics.HTTP, pattern string, h http.Handler) http.Handler {
	if m == nil {
		return h
	}
	method, route, ok := strings.Cut(pattern, " ")
	if !ok {
		method, route = "", pattern
	}
	if route == "/" {
		route = metrics.UnmatchedRoute
	}
	var seconds prometheus.Observer
	if method != "" {
		seconds = m.Seconds.WithLabelValues(method, route)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m.Inflight.Inc()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			m.Inflight.Dec()
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			meth := method
			if meth == "" {
				meth = knownMethod(r.Method)
			}
			m.Requests.WithLabelValues(meth, route, codeLabel(code)).Inc()
			obs := seconds
			if obs == nil {
				obs = m.Seconds.WithLabelValues(meth, route)
			}
			obs.Observe(time.Since(start).Seconds())
		}()
		h.ServeHTTP(sw, r)
	})
}

// codeLabels are the code label of every status from 100 to 599, made
// once: strconv.Itoa allocates for numbers over 99, on every request.
var codeLabels = func() (out [500]string) {
	for i := range out {
		out[i] = strconv.Itoa(100 + i)
	}
	return out
}()

// codeLabel is code as a label value.
func codeLabel(code int) string {
	if code >= 100 && code < 600 {
		return codeLabels[code-100]
	}
	return strconv.Itoa(code)
}

// knownMethod is method when it is a standard HTTP method, else OTHER.
func knownMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "OTHER"
}

// statusWriter remembers the status code written. Unwrap lets
// http.ResponseController reach the connection's writer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
