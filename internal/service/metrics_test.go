package service_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
)

// heldTarget answers by the job id's prefix: hold- waits until release
// is closed, then 200; dead- 410 (refused for good); retry- 500; else 200.
type heldTarget struct {
	srv     *httptest.Server
	release chan struct{}
	once    sync.Once
	holding atomic.Int32
}

func newHeldTarget(t *testing.T) *heldTarget {
	h := &heldTarget{release: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("Idempotency-Key")
		switch {
		case strings.HasPrefix(id, "hold-"):
			h.holding.Add(1)
			<-h.release
		case strings.HasPrefix(id, "dead-"):
			w.WriteHeader(http.StatusGone)
		case strings.HasPrefix(id, "retry-"):
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(h.srv.Close)
	t.Cleanup(h.let)
	return h
}

func (h *heldTarget) let() { h.once.Do(func() { close(h.release) }) }

// runWithRegistry runs a service on reg with the lanes' queue gauges read
// every 100 ms, until the test ends.
func runWithRegistry(t *testing.T, cfg config.Config, reg *prometheus.Registry) *service.Service {
	t.Helper()
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), reg)
	service.SetQueueStatsEvery(svc, 100*time.Millisecond)
	servicetest.Run(t, svc)
	return svc
}

// configHead is the head of a test config, up to its lanes: listen on a
// free port, the nats-server at natsURL with a data_dir of the test's own,
// the Redis at redisURL ("" for the in-memory pacer), and targets on the
// loopback allowed.
func configHead(t *testing.T, natsURL, redisURL string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, data_dir: %q}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
`, natsURL, t.TempDir(), redisURL)
}

func metricsConfig(t *testing.T, target string) config.Config {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {data_dir: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 20
    burst: 10
    max_inflight: 1
    retry: {max_attempts: 3, backoff_base: 10m, backoff_max: 10m}
    target: {http: {url: %q}}
`, t.TempDir(), target)
	cfg, err := config.Parse("metrics.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func post(t *testing.T, addr, id string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit %s: %d", id, resp.StatusCode)
	}
}

// waitMetrics gathers reg until every want holds (servicetest.WaitFor).
func waitMetrics(t *testing.T, reg *prometheus.Registry, within time.Duration, want map[string]float64) servicetest.Series {
	t.Helper()
	return servicetest.WaitFor(t, within, func() servicetest.Series { return servicetest.Gather(t, reg) }, want)
}

// TestLaneMetrics: every per-lane series exists at 0 from the start (so the
// first dead letter is an increase an alert sees); the JetStream-derived
// gauges follow the queue; the histograms and the utilization follow the
// jobs.
func TestLaneMetrics(t *testing.T) {
	t.Parallel()
	target := newHeldTarget(t)
	reg := prometheus.NewRegistry()
	svc := runWithRegistry(t, metricsConfig(t, target.srv.URL), reg)

	atStart := servicetest.Gather(t, reg)
	for _, k := range []string{
		`throttler_jobs_dead_lettered_total{lane="demo"}`,
		`throttler_dispatches_total{lane="demo",outcome="dead"}`,
		`throttler_lane_pauses_total{lane="demo"}`,
		`throttler_jobs_rejected_total{lane="demo",reason="backlog_full"}`,
		`throttler_jobs_submitted_total{lane="demo",source="nats",state="queued"}`,
		`throttler_pacer_calls_total{lane="demo",op="pause"}`,
		`throttler_job_queue_wait_seconds_count{lane="demo"}`,
		`throttler_job_end_to_end_seconds_count{lane="demo"}`,
		`throttler_lane_backlog{lane="demo"}`,
		`throttler_lane_oldest_job_age_seconds{lane="demo"}`,
		`throttler_lane_retrying{lane="demo"}`,
		`throttler_lane_dead_letters{lane="demo"}`,
		`throttler_lane_paused{lane="demo"}`,
		`throttler_lane_utilization{lane="demo"}`,
	} {
		if v, ok := atStart[k]; !ok || v != 0 {
			t.Errorf("at start: %s = %v (present %v), want 0", k, v, ok)
		}
	}
	for k, want := range map[string]float64{
		`throttler_lane_configured_rate{lane="demo"}`: 20,
		`throttler_lane_burst{lane="demo"}`:           10,
		`throttler_lane_effective_rate{lane="demo"}`:  20,
		`throttler_pacer_up{lane="demo"}`:             1,
	} {
		if atStart[k] != want {
			t.Errorf("at start: %s = %v, want %v", k, atStart[k], want)
		}
	}

	// One job held by the target (max_inflight 1), three waiting behind it.
	for _, id := range []string{"hold-1", "w-1", "w-2", "w-3"} {
		post(t, svc.Addr(), id)
	}
	waitMetrics(t, reg, 5*time.Second, map[string]float64{
		`throttler_lane_backlog{lane="demo"}`:                4,
		`throttler_lane_oldest_job_age_seconds{lane="demo"}`: servicetest.Any,
		`throttler_dispatches_inflight{lane="demo"}`:         1,
	})
	// The age grows between reads and scrapes.
	a1 := servicetest.Gather(t, reg)[`throttler_lane_oldest_job_age_seconds{lane="demo"}`]
	time.Sleep(300 * time.Millisecond)
	if a2 := servicetest.Gather(t, reg)[`throttler_lane_oldest_job_age_seconds{lane="demo"}`]; a2 < a1+0.2 {
		t.Fatalf("oldest job age went from %v to %v in 300 ms", a1, a2)
	}

	target.let()
	post(t, svc.Addr(), "dead-1")
	post(t, svc.Addr(), "retry-1")
	got := waitMetrics(t, reg, 10*time.Second, map[string]float64{
		`throttler_lane_backlog{lane="demo"}`:                     0,
		`throttler_lane_oldest_job_age_seconds{lane="demo"}`:      0,
		`throttler_lane_dead_letters{lane="demo"}`:                1,
		`throttler_lane_retrying{lane="demo"}`:                    1,
		`throttler_jobs_dead_lettered_total{lane="demo"}`:         1,
		`throttler_dispatches_total{lane="demo",outcome="done"}`:  4,
		`throttler_dispatches_total{lane="demo",outcome="dead"}`:  1,
		`throttler_dispatches_total{lane="demo",outcome="retry"}`: 1,
		// Six starts; five jobs settled (four done, one dead), the
		// retry is not.
		`throttler_job_queue_wait_seconds_count{lane="demo"}`: 6,
		`throttler_job_end_to_end_seconds_count{lane="demo"}`: 5,
		`throttler_lane_utilization{lane="demo"}`:             servicetest.Any,
	})
	// Six starts within a few seconds of the lane's start, at 20/s.
	if u := got[`throttler_lane_utilization{lane="demo"}`]; u > 1 {
		t.Errorf("utilization %v, want at most 1 for 6 starts", u)
	}
}

// TestOpenMetricsWhenAsked: /metrics answers OpenMetrics to a scraper that
// asks for it, and the classic text format otherwise.
func TestOpenMetricsWhenAsked(t *testing.T) {
	t.Parallel()
	target := newHeldTarget(t)
	svc := runWithRegistry(t, metricsConfig(t, target.srv.URL), prometheus.NewRegistry())
	get := func(accept string) (string, string) {
		req, _ := http.NewRequest("GET", "http://"+svc.Addr()+"/metrics", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
		}
		return resp.Header.Get("Content-Type"), string(body)
	}
	ct, body := get("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
	if !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("asked for OpenMetrics, got Content-Type %q", ct)
	}
	if !strings.HasSuffix(body, "# EOF\n") || !strings.Contains(body, "# TYPE throttler_jobs_dead_lettered counter\n") ||
		!strings.Contains(body, `throttler_jobs_dead_lettered_total{lane="demo"} 0`) {
		t.Errorf("OpenMetrics body lacks its EOF, a counter family or the lane's series at 0:\n%.2000s", body)
	}
	ct, body = get("")
	if !strings.HasPrefix(ct, "text/plain") || strings.Contains(body, "# EOF") {
		t.Errorf("without Accept: Content-Type %q, EOF marker %v", ct, strings.Contains(body, "# EOF"))
	}
	if !strings.Contains(body, "# TYPE throttler_jobs_dead_lettered_total counter\n") {
		t.Errorf("text body lacks the counter family")
	}
}
