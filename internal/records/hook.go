package records

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/throttler/throttler/api"
)

// Hook keeps the records of delayed and expiring jobs: it is the queue's
// ScheduleHook (queue.SetScheduleHook). A delayed job is scheduled until it
// enters its lane (then queued); a job dead-lettered at its expiry is
// expired. Lanes without results are skipped. Each moment is one write,
// made on the caller's goroutine with a bound: the queue calls it after
// the job's own store, so a failure only leaves the record a state behind
// (logged); the job itself is never lost or started by it.
type Hook struct {
	s   *Store
	log *slog.Logger
	now func() time.Time
}

// NewHook returns the hook writing to s.
func NewHook(s *Store, logger *slog.Logger) *Hook {
	return &Hook{s: s, log: logger, now: time.Now}
}

// hookTimeout bounds one write of the hook.
const hookTimeout = 2 * time.Second

func (h *Hook) mark(lane, id string, state api.JobState, reason, reply string) {
	if !h.s.Keeps(lane) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), hookTimeout)
	defer cancel()
	_, err := h.s.mark(ctx, lane, id, state, reason, reply, h.now().UTC())
	switch {
	case err == nil:
	case errors.Is(err, ErrStarted):
		// Cancelled, or started already: the record's state stands.
	default:
		h.log.Warn("writing a job's record failed", "lane", lane, "id", id, "state", state, "err", err)
	}
}

// Scheduled records a delayed job stored; reply is its reply subject.
func (h *Hook) Scheduled(lane, id string, _ time.Time, reply string) {
	h.mark(lane, id, api.StateScheduled, "", reply)
}

// Entered records a delayed job that entered its lane.
func (h *Hook) Entered(lane, id string) { h.mark(lane, id, api.StateQueued, "", "") }

// Expired records a job dead-lettered at its expiry; reply is its reply
// subject (queue.Job.Reply, checked by the store before it publishes
// there).
func (h *Hook) Expired(lane, id, reply string) {
	h.mark(lane, id, api.StateExpired, "expired", reply)
}

// Replaying puts a replayed job's record back to queued (Store.Replaying);
// a lane without results has nothing to do. It is the queue's ReplayHook.
func (h *Hook) Replaying(ctx context.Context, r Replay) (func(), error) {
	if !h.s.Keeps(r.Lane) {
		return func() {}, nil
	}
	return h.s.Replaying(ctx, r, h.now().UTC())
}
