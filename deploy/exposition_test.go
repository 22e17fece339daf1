package deploy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
)

// TestExpositionPassesPromtool: /metrics of a running service, as text and
// as OpenMetrics (what a scraper asking for it gets), passes
// `promtool check metrics`: no family described twice, names by
// Prometheus's conventions. It once failed on OpenMetrics with a second
// HELP line for go_memstats_alloc_bytes (the Go collector's gauge and its
// _total counter share a family name there).
func TestExpositionPassesPromtool(t *testing.T) {
	bin := promtool(t)
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {data_dir: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 20
    burst: 10
    target: {http: {url: "http://127.0.0.1:1/never"}}
`, t.TempDir())
	cfg, err := config.Parse("deploy-test.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewBuildInfo(metrics.Build{Version: "v0.0.0-test", Revision: "unknown", GoVersion: runtime.Version()}))
	svc := service.New(cfg, slog.New(slog.DiscardHandler), reg)
	stop := servicetest.Run(t, svc)
	defer stop()
	for _, accept := range []string{"text/plain; version=0.0.4", "application/openmetrics-text; version=1.0.0; charset=utf-8"} {
		req, _ := http.NewRequest("GET", "http://"+svc.Addr()+"/metrics", nil)
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		format := resp.Header.Get("Content-Type")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics (%s): %d", accept, resp.StatusCode)
		}
		if strings.HasPrefix(accept, "application/openmetrics") != strings.HasPrefix(format, "application/openmetrics") {
			t.Fatalf("asked for %s, got %s", accept, format)
		}
		cmd := exec.Command(bin, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		out, err := cmd.CombinedOutput()
		if err == nil {
			continue
		}
		if !strings.HasPrefix(format, "application/openmetrics") {
			t.Errorf("promtool check metrics on the %s exposition: %v\n%s", format, err, out)
			continue
		}
		// promtool reads the Prometheus text format: on OpenMetrics a
		// counter's HELP names its family (no _total) while its samples
		// keep _total, so promtool reports those counters without help.
		// That finding, for a counter whose family has its HELP, is the
		// only one allowed; a parse error (a second HELP line) or any
		// other finding fails.
		for line := range strings.Lines(strings.TrimSpace(string(out))) {
			line = strings.TrimSpace(line)
			name, ok := strings.CutSuffix(line, "_total no help text")
			if ok && strings.Contains(string(body), "\n# HELP "+name+" ") && strings.Contains(string(body), "\n# TYPE "+name+" counter\n") {
				continue
			}
			t.Errorf("promtool check metrics on the %s exposition: %s\n(all of it: %v\n%s)", format, line, err, out)
		}
	}
}
