package service_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// TestRaisedRateAppliesToTheBacklog: a lane at 1/s, burst 1, holding a
// backlog, is PATCHed to 500/s: the backlog drains at the new rate, not at
// the slots reserved at the old one. On both pacers.
//
// Outcomes with a margin far beyond a stall: the rest of the backlog must
// arrive within 10 s of the PATCH, where the old rate would take 59 s; in
// the parallel phase.
func TestRaisedRateAppliesToTheBacklog(t *testing.T) {
	t.Parallel()
	for _, pacer := range []string{"memory", "redis"} {
		t.Run(pacer, func(t *testing.T) {
			rec := newRecorder(t)
			cfg := testConfig(t, t.TempDir(), rec.srv.URL, 1, 1)
			if pacer == "redis" {
				cfg.Redis.URL = testenv.StartRedis(t).URL()
			}
			svc, _ := start(t, cfg)
			client := &http.Client{Timeout: 5 * time.Second}
			defer client.CloseIdleConnections()
			const n = 60
			for i := range n {
				if code, _, _ := submit(t, client, svc.Addr(), "demo", "", "x"); code != http.StatusAccepted {
					t.Fatalf("job %d: %d", i, code)
				}
			}
			// The drain has read ahead and reserved at 1/s by now.
			waitFor(t, 10*time.Second, "the first job delivered", func() bool { return len(rec.snapshot()) >= 1 })
			if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"rate":"500/s","burst":1}`, nil); code != http.StatusOK {
				t.Fatalf("PATCH: %d", code)
			}
			patched := time.Now()
			// At 500/s the rest takes 0.12 s; at the old rate a minute. Ten
			// seconds allows for a loaded machine and bounds nothing else.
			waitFor(t, 10*time.Second, "the backlog drained at the new rate", func() bool { return len(rec.snapshot()) >= n })
			t.Logf("%d jobs drained %v after the PATCH", n-1, time.Since(patched).Round(time.Millisecond))
		})
	}
}
