package ingest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// TestReadyz: /readyz passes while the service is ready, fails with the
// reason while a backend is away (Config.Ready), and fails once a stop
// began, whatever Ready says; submissions then get 503 as well, and
// /healthz still passes (the process is alive).
func TestReadyz(t *testing.T) {
	t.Parallel()
	var away error
	f := newFixture(t, func(c *Config) {
		c.Ready = func(context.Context) error { return away }
	})
	check := func(stage string, want int, detail string) {
		t.Helper()
		rec := do(f.h, "GET", "/readyz", "", "", nil)
		if rec.Code != want || !strings.Contains(rec.Body.String(), detail) {
			t.Fatalf("%s: /readyz %d %s, want %d with %q", stage, rec.Code, rec.Body, want, detail)
		}
		if rec := do(f.h, "GET", "/healthz", "", "", nil); rec.Code != http.StatusOK {
			t.Fatalf("%s: /healthz %d", stage, rec.Code)
		}
	}
	check("ready", http.StatusOK, "ready")
	away = errors.New("nats connection is RECONNECTING")
	check("NATS away", http.StatusServiceUnavailable, "nats connection is RECONNECTING")
	away = nil
	check("NATS back", http.StatusOK, "ready")
	before := f.pub.n.Load()
	f.h.StopIntake()
	check("stopping", http.StatusServiceUnavailable, "shutting down")
	if rec := do(f.h, "POST", "/v1/lanes/demo/jobs", "", "x", map[string]string{"Content-Type": "text/plain"}); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("submission while stopping: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if f.pub.n.Load() != before {
		t.Fatal("a submission while stopping was stored")
	}
}
