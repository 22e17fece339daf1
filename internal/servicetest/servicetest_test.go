package servicetest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/servicetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

func TestParseText(t *testing.T) {
	t.Parallel()
	s, err := servicetest.ParseText([]byte(`# HELP a_total A.
# TYPE a_total counter
a_total 3
b{lane="demo",outcome="done"} 7
b{lane="my lane",outcome="dead"} 1.5
h_bucket{lane="demo",le="+Inf"} 2
`))
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		"a_total":                          3,
		`b{lane="demo",outcome="done"}`:    7,
		`b{lane="my lane",outcome="dead"}`: 1.5,
		`h_bucket{lane="demo",le="+Inf"}`:  2,
	} {
		if got, ok := s.Get(series); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if len(s) != 4 {
		t.Errorf("%d series, want 4: %v", len(s), s)
	}
	if sum, ok := s.Sum("b"); !ok || sum != 8.5 {
		t.Errorf("Sum(b) = %v %v, want 8.5", sum, ok)
	}
	if _, ok := s.Sum("a"); ok {
		t.Errorf("Sum(a) found a_total: a family is matched by its whole name")
	}
	if g, want := s.Grep("outcome"), "b{lane=\"demo\",outcome=\"done\"} 7\nb{lane=\"my lane\",outcome=\"dead\"} 1.5"; g != want {
		t.Errorf("Grep:\n%s\nwant\n%s", g, want)
	}
	for _, bad := range []string{"a_total\n", "a_total three\n"} {
		if _, err := servicetest.ParseText([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestScrapeIsGather: a running service's /metrics and a gather of its
// registry read as the same series (histograms as _bucket, _sum, _count),
// and Value reads one of them.
func TestScrapeIsGather(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse("servicetest.yaml", []byte(fmt.Sprintf(`listen: 127.0.0.1:0
nats: {data_dir: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 20
    burst: 10
    target: {http: {url: "http://127.0.0.1:1/never"}}
`, t.TempDir())), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, stop := servicetest.Start(t, cfg, reg)
	scraped, _ := servicetest.Scrape(t, svc.Addr(), "")
	gathered := servicetest.Gather(t, reg)
	for _, series := range []string{`throttler_lane_burst{lane="demo"}`, `throttler_job_queue_wait_seconds_count{lane="demo"}`} {
		if _, ok := gathered.Get(series); !ok {
			t.Errorf("the gather lacks %s", series)
		}
	}
	// The scrape counts itself (promhttp's own series, and the API's
	// request metrics once it is answered), so compare the service's. The
	// backends' probes run on their own timer, and one may land between
	// the scrape and the gather: their series are left out too.
	n := 0
	for k, v := range gathered {
		if !strings.HasPrefix(k, "throttler_") || strings.HasPrefix(k, "throttler_http_request") || strings.HasPrefix(k, "throttler_backend_") ||
			k == `throttler_lane_oldest_job_age_seconds{lane="demo"}` {
			continue
		}
		n++
		if got, ok := scraped[k]; !ok || got != v {
			t.Errorf("%s: gathered %v, scraped %v (present %v)", k, v, got, ok)
		}
	}
	if n < 20 {
		t.Errorf("compared %d throttler_ series; the registry holds more", n)
	}
	if v, err := servicetest.Value(svc.Addr(), `throttler_lane_burst{lane="demo"}`); err != nil || v != 10 {
		t.Errorf("Value: %v %v, want 10", v, err)
	}
	if _, err := servicetest.Value(svc.Addr(), `throttler_lane_burst{lane="nope"}`); !errors.Is(err, servicetest.ErrNoSeries) {
		t.Errorf("Value of a missing series: %v, want ErrNoSeries", err)
	}
	stop()
	if _, _, err := servicetest.TryScrape(svc.Addr(), ""); err == nil {
		t.Errorf("a stopped service answered /metrics")
	}
}

// TestWaitFor: it reads until every want holds, Any asking for a value
// above 0, and returns that read.
func TestWaitFor(t *testing.T) {
	t.Parallel()
	reads := 0
	got := servicetest.WaitFor(t, 10*time.Second, func() servicetest.Series {
		reads++
		return servicetest.Series{"a": float64(reads), "b": float64(reads - 3)}
	}, map[string]float64{"a": 5, "b": servicetest.Any})
	if reads != 5 || got["a"] != 5 || got["b"] != 2 {
		t.Fatalf("%d reads, returned %v; want the fifth read (a = 5, b = 2 > 0)", reads, got)
	}
}
