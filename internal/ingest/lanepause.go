package ingest

import (
	"context"
	"errors"
	"net/http"

	"github.com/throttler/throttler/api"
)

// LanePauser holds and releases lanes on every instance, lastingly
// (PATCH /v1/lanes/{lane} {"paused": true|false}). While a lane is held,
// intake still takes and queues its jobs; none starts. by names the caller
// (its key id), for the audit log and the lane's status.
type LanePauser interface {
	SetPaused(ctx context.Context, lane string, paused bool, by string) (api.LaneStatus, error)
}

// ErrPauseUnavailable: the service has no store for runtime changes, so a
// pause could reach neither the other instances nor a restart.
var ErrPauseUnavailable = errors.New("ingest: lanes cannot be paused here")

// setPaused answers PATCH /v1/lanes/{lane} {"paused": …}.
func (h *Handler) setPaused(w http.ResponseWriter, r *http.Request, lane string, paused bool) error {
	if h.cfg.Pauser == nil {
		return refusal(ErrBadBody, "paused", "this service cannot pause lanes")
	}
	st, err := h.cfg.Pauser.SetPaused(r.Context(), lane, paused, callerOf(r))
	if errors.Is(err, ErrPauseUnavailable) {
		return &Refusal{Err: ErrBadBody, Cause: err, Field: "paused", Detail: err.Error()}
	}
	if err != nil {
		return refusalOf(err, "the pause could not be stored: %v", err)
	}
	action := "resume"
	if paused {
		action = "pause"
	}
	h.audit(r, "lane "+action+"d", action, lane)
	writeJSON(w, http.StatusOK, st)
	return nil
}
