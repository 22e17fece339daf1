package lane

import (
	"context"
	"sync"
	"time"

	"github.com/throttler/throttler/api"
)

// The lane's throughput over the last minutes: every HistoryEvery, the
// starts of this instance since the last sample (per second) and the
// lane's backlog (JetStream's count, shared with admission's reads: at
// most one stream info per interval). HistoryLen samples are kept in a
// ring, ten minutes at the default interval; the status page draws them.

// Sampling of the lane's history.
const (
	DefaultHistoryEvery = 5 * time.Second
	HistoryLen          = 120
)

// history is a ring of the last HistoryLen samples. Safe for concurrent
// use.
type history struct {
	mu      sync.Mutex
	samples [HistoryLen]api.LaneSample
	n, next int
	added   int // samples ever added
}

func (h *history) add(s api.LaneSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples[h.next] = s
	h.next = (h.next + 1) % HistoryLen
	h.n = min(h.n+1, HistoryLen)
	h.added++
}

// total counts the samples ever added.
func (h *history) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.added
}

// list returns the samples, oldest first.
func (h *history) list() []api.LaneSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]api.LaneSample, 0, h.n)
	for i := range h.n {
		out = append(out, h.samples[(h.next-h.n+i+HistoryLen)%HistoryLen])
	}
	return out
}

// History is the lane's throughput over the last minutes, oldest first.
func (l *Lane) History() api.LaneHistory {
	return api.LaneHistory{Lane: l.cfg.Name, IntervalSeconds: l.historyEvery().Seconds(), Samples: l.hist.list()}
}

func (l *Lane) historyEvery() time.Duration {
	if l.d.HistoryEvery > 0 {
		return l.d.HistoryEvery
	}
	return DefaultHistoryEvery
}

// watchHistory samples the lane every historyEvery until ctx ends.
func (l *Lane) watchHistory(ctx context.Context) {
	every := l.historyEvery()
	t := time.NewTicker(every)
	defer t.Stop()
	last, lastAt := l.startsTotal.Load(), l.d.Clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, now := l.startsTotal.Load(), l.d.Clock.Now()
		s := api.LaneSample{At: now.UTC()}
		if dt := now.Sub(lastAt).Seconds(); dt > 0 {
			s.StartsPerSecond = float64(n-last) / dt
		}
		last, lastAt = n, now
		rctx, cancel := context.WithTimeout(ctx, every)
		if b, err := l.d.Queue.Backlog(rctx, l.cfg.Name, every); err == nil {
			v := uint64(max(b, 0))
			s.Backlog = &v
		}
		cancel()
		l.hist.add(s)
	}
}
