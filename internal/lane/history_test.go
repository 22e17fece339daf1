package lane

import (
	"testing"
	"time"

	"github.com/throttler/throttler/api"
)

// TestHistoryRing: the ring keeps the last HistoryLen samples, oldest
// first, through its wrap.
func TestHistoryRing(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var h history
	if got := h.list(); len(got) != 0 {
		t.Fatalf("empty ring lists %d samples", len(got))
	}
	for _, step := range []struct {
		add        int // samples added before the check, in all
		wantLen    int
		wantOldest int // index of the oldest sample listed
	}{
		{1, 1, 0},
		{HistoryLen - 1, HistoryLen - 1, 0},
		{HistoryLen, HistoryLen, 0},
		{HistoryLen + 1, HistoryLen, 1},
		{3*HistoryLen + 7, HistoryLen, 2*HistoryLen + 7},
	} {
		for h.total() < step.add {
			i := h.total()
			h.add(api.LaneSample{At: t0.Add(time.Duration(i) * time.Second), StartsPerSecond: float64(i)})
		}
		got := h.list()
		if len(got) != step.wantLen || got[0].StartsPerSecond != float64(step.wantOldest) ||
			got[len(got)-1].StartsPerSecond != float64(step.add-1) {
			t.Fatalf("after %d samples: %d listed, oldest %v newest %v; want %d from %d to %d",
				step.add, len(got), got[0].StartsPerSecond, got[len(got)-1].StartsPerSecond, step.wantLen, step.wantOldest, step.add-1)
		}
		for i := 1; i < len(got); i++ {
			if !got[i].At.After(got[i-1].At) {
				t.Fatalf("after %d samples: not oldest first at %d", step.add, i)
			}
		}
	}
}
