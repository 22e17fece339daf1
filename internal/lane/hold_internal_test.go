package lane

import (
	"testing"
	"time"
)

// TestHoldAppliesChangesInRevisionOrder: a stored change older than the
// last one applied changes nothing, so an instance's own pause, applied
// after the watch brought another instance's later resume, never holds the
// lane again.
func TestHoldAppliesChangesInRevisionOrder(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		paused     bool
		rev        uint64
		changed    bool
		wantPaused bool
	}{
		{true, 5, true, true},   // paused at rev 5
		{false, 7, true, false}, // another instance's resume, by the watch
		{true, 5, false, false}, // this instance's own pause again, late: ignored
		{true, 6, false, false}, // still older than 7
		{true, 8, true, true},   // a newer pause
		{true, 8, false, true},  // the same change twice: no change
		{false, 9, true, false},
	}
	var h hold
	for i, s := range steps {
		if got := h.set(s.paused, "ops", t0, s.rev); got != s.changed {
			t.Errorf("step %d: set(%v, rev %d) changed = %v, want %v", i, s.paused, s.rev, got, s.changed)
		}
		if p, _, _ := h.state(); p != s.wantPaused {
			t.Errorf("step %d: paused = %v, want %v", i, p, s.wantPaused)
		}
	}
}
