package bench

import (
	"path/filepath"
	"testing"

	"github.com/throttler/throttler/internal/config"
)

// TestExampleLaneIsTheConfigs: the rss scenario's example-config row
// measures the lane of configs/throttler.yaml (what `make run` serves); the
// two must not drift apart.
func TestExampleLaneIsTheConfigs(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "configs", "throttler.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Lanes) != 1 {
		t.Fatalf("configs/throttler.yaml has %d lanes, the bench row measures one", len(cfg.Lanes))
	}
	l := cfg.Lanes[0]
	if l.Rate.PerSecond() != exampleLane.rate || l.Burst != exampleLane.burst || l.MaxInflight != exampleLane.inflight || l.MaxBacklog != exampleLane.backlog {
		t.Fatalf("configs/throttler.yaml's lane: rate %v/s burst %d max_inflight %d max_backlog %d; the bench measures %+v",
			l.Rate.PerSecond(), l.Burst, l.MaxInflight, l.MaxBacklog, exampleLane)
	}
	if w := cfg.NATS.DedupWindow.D(); w != config.Default().NATS.DedupWindow.D() {
		t.Fatalf("configs/throttler.yaml sets dedup_window %v; the bench's generated config leaves the default", w)
	}
}
