package ingest

import (
	"encoding/json"
	"net/http"

	"github.com/throttler/throttler/api"
)

// HistoryReader serves a lane's throughput over the last minutes (starts
// per second on this instance, backlog), sampled by the lane.
type HistoryReader interface {
	History(lane string) (api.LaneHistory, bool)
}

// routeHistory adds GET /v1/lanes/{lane}/history (scope read), which the
// status page draws as a line per lane; without Config.History there is
// no such route.
func (h *Handler) routeHistory() {
	if h.cfg.History == nil {
		return
	}
	h.mux.HandleFunc("GET /v1/lanes/{lane}/history", h.authorize(needRead, h.admin(h.history)))
}

func (h *Handler) history(w http.ResponseWriter, _ *http.Request, lane string) error {
	out, ok := h.cfg.History.History(lane)
	if !ok {
		return refusal(ErrUnknownLane, "lane", "no lane named %s is running", clip(lane))
	}
	if out.Samples == nil {
		out.Samples = []api.LaneSample{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
	return nil
}
