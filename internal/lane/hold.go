package lane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/throttler/throttler/internal/queue"
)

// An operator's hold on a lane (PATCH /v1/lanes/{lane} {"paused": true}):
// no instance starts the lane's jobs until it is released, while intake
// keeps taking and queueing them. It is stored in the limits bucket
// (queue.LanePause), so it reaches every instance through their watch and
// outlives restarts; it has no end of its own, unlike a downstream's pause.

// hold is the lane's operator hold on this instance. Safe for concurrent
// use; the zero value is not held.
type hold struct {
	mu sync.Mutex
	// wait is open while the lane is held; closed and cleared at the
	// release, which wakes every drain waiting on it.
	wait chan struct{}
	by   string
	at   time.Time
	// rev is the revision of the stored change applied last: an older one
	// (this instance's own, applied after the watch brought a newer one
	// from another instance) is not applied.
	rev uint64
}

// held returns a channel that closes at the release while the lane is
// held, else nil (leaky.Config.Held).
func (h *hold) held() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wait == nil {
		return nil
	}
	return h.wait
}

// set holds or releases the lane as the stored change of revision rev
// says; it reports whether that changed. A change older than the last one
// applied changes nothing.
func (h *hold) set(paused bool, by string, at time.Time, rev uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev < h.rev {
		return false
	}
	h.rev = rev
	switch {
	case paused && h.wait == nil:
		h.wait, h.by, h.at = make(chan struct{}), by, at
		return true
	case !paused && h.wait != nil:
		close(h.wait)
		h.wait, h.by, h.at = nil, "", time.Time{}
		return true
	}
	return false
}

// state reports whether the lane is held, by whom and since when.
func (h *hold) state() (paused bool, by string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wait != nil, h.by, h.at
}

// applyPause applies a stored hold (from any instance, this one included).
func (l *Lane) applyPause(v queue.LanePause) {
	if l.hold.set(v.Paused, v.By, v.At, v.Rev) {
		if v.Paused {
			l.log.Info("lane paused by an operator (stored)", "by", v.By, "at", v.At)
		} else {
			l.log.Info("lane resumed by an operator (stored)", "by", v.By)
		}
	}
}

// ErrNoLimitsStore: the lane has no store for runtime changes, so a hold
// could reach neither the other instances nor a restart.
var ErrNoLimitsStore = errors.New("lane: no store for runtime changes")

// SetPaused holds (paused) or releases the lane on every instance: it is
// stored (Deps.Limits), which every instance watches, and applied here at
// once. by names who asked, for the log and the status.
func (l *Lane) SetPaused(ctx context.Context, paused bool, by string) error {
	if l.d.Limits == nil {
		return ErrNoLimitsStore
	}
	at := l.d.Clock.Now().UTC()
	rev, err := l.d.Limits.PutPause(ctx, l.cfg.Name, queue.LanePause{Paused: paused, By: by, At: at})
	if err != nil {
		return fmt.Errorf("storing the pause: %w", err)
	}
	l.applyPause(queue.LanePause{Paused: paused, By: by, At: at, Rev: rev})
	return nil
}

// Held reports whether an operator holds the lane.
func (l *Lane) Held() bool {
	p, _, _ := l.hold.state()
	return p
}
