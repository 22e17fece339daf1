package ingest

import (
	"testing"

	"github.com/throttler/throttler/internal/admission"
)

// TestStartsNow: a submission waits to hear its slot only when the lane
// has room and no operator holds it: a held lane's job is answered queued
// at once instead of after admit_wait.
func TestStartsNow(t *testing.T) {
	held := func() bool { return true }
	free := func() bool { return false }
	for _, c := range []struct {
		name string
		room bool
		held func() bool
		want bool
	}{
		{"room, never held", true, nil, true},
		{"room, not held", true, free, true},
		{"room, held", true, held, false},
		{"no room", false, free, false},
		{"no room, held", false, held, false},
	} {
		if got := (Lane{Held: c.held}).startsNow(admission.Decision{Room: c.room}); got != c.want {
			t.Errorf("%s: startsNow %v, want %v", c.name, got, c.want)
		}
	}
}
