package ingest

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler/throttler/internal/metrics"
)

// TestRequestMetricsByRouteTemplate: requests count under the route
// template they matched and the status answered, never their raw path; a
// path no route matches counts as unmatched, and a made-up method as OTHER
// (both bounded, whatever clients send).
func TestRequestMetricsByRouteTemplate(t *testing.T) {
	var m *metrics.Metrics
	f := newFixture(t, func(c *Config) { m = c.Metrics })
	for _, r := range []struct{ method, path string }{
		{"POST", "/v1/lanes/demo/jobs"}, {"POST", "/v1/lanes/nope/jobs"}, {"GET", "/v1/lanes"},
		{"GET", "/no/such/path/123"}, {"BREW", "/coffee"},
	} {
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, httptest.NewRequest(r.method, "http://127.0.0.1"+r.path, strings.NewReader("x")))
	}
	count := func(method, route, code string) float64 {
		return testutil.ToFloat64(m.HTTP.Requests.WithLabelValues(method, route, code))
	}
	for _, c := range []struct {
		method, route, code string
	}{
		{"POST", "/v1/lanes/{lane}/jobs", "202"},
		{"POST", "/v1/lanes/{lane}/jobs", "404"},
		{"GET", "/v1/lanes", "200"},
		{"GET", metrics.UnmatchedRoute, "404"},
		{"OTHER", metrics.UnmatchedRoute, "404"},
	} {
		if n := count(c.method, c.route, c.code); n != 1 {
			t.Errorf("%s %s %s counted %v times, want 1", c.method, c.route, c.code, n)
		}
	}
	if n := testutil.CollectAndCount(m.HTTP.Requests); n != 5 {
		t.Errorf("%d request series, want 5 (one per route, method and code)", n)
	}
	// The latency series exist per registered route from the start; none
	// carries a raw path.
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.HTTP.Seconds, m.HTTP.Requests)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		for _, s := range fam.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "route" && (strings.Contains(l.GetValue(), "demo") || strings.Contains(l.GetValue(), "123") || strings.Contains(l.GetValue(), "coffee")) {
					t.Errorf("%s has a raw path as its route: %q", fam.GetName(), l.GetValue())
				}
			}
		}
	}
	if v := testutil.ToFloat64(m.HTTP.Inflight); v != 0 {
		t.Errorf("%v requests in flight after all answered", v)
	}
}
