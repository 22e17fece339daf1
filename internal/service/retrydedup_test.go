package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestDelayedJobsDedupForTheWindow: a delayed job waits in the retry
// stream under its job id's msg id, so that stream remembers ids as long
// as the lanes do (nats.dedup_window): with a window of 10 minutes, a
// delayed job resubmitted with the same Idempotency-Key five minutes later
// must still be a duplicate, not a second job delivered beside the first.
func TestDelayedJobsDedupForTheWindow(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:9", 100, 1)
	cfg.NATS.URL = srv.ClientURL()
	cfg.NATS.DedupWindow = config.Duration(10 * time.Minute)
	start(t, cfg)
	_, js := testenv.JetStream(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range []string{queue.StreamName("demo"), queue.RetryStream} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if d := st.CachedInfo().Config.Duplicates; d != 10*time.Minute {
			t.Errorf("stream %s remembers msg ids for %v, want nats.dedup_window (10m)", name, d)
		}
	}
}
