package lane

import (
	"context"
	"log/slog"
	"time"

	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/queue"
)

// DefaultQueueStatsEvery is how often an instance reads the lanes'
// JetStream-derived gauges.
const DefaultQueueStatsEvery = 5 * time.Second

// QueueReader is what WatchQueues reads from JetStream.
type QueueReader interface {
	Depth(ctx context.Context, lane string) (queue.Depth, error)
	RetriesByLane(ctx context.Context) (map[string]uint64, error)
	DeadByLane(ctx context.Context) (map[string]uint64, error)
}

var _ QueueReader = (*queue.Queue)(nil)

// WatchQueues keeps the lanes' backlog, oldest-job, retrying and
// dead-letter gauges current until ctx ends: at once, then every `every`.
//
// It reads in the background rather than at each scrape, so that the cost
// is fixed: one stream info per lane, plus one each for the retry and
// dead-letter streams (all lanes at once), per interval and instance,
// however many Prometheus servers scrape and however often; and a scrape
// never waits for JetStream. The gauges are at most one interval old;
// the oldest job's age is computed at the scrape, so it keeps growing in
// between (and while JetStream cannot be read: a read that fails keeps the
// last values, and is logged once until reads work again).
func WatchQueues(ctx context.Context, q QueueReader, lanes []string, m *metrics.Metrics, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		every = DefaultQueueStatsEvery
	}
	failing := false
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		err := readQueues(ctx, q, lanes, m, every)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			log.Warn("reading the lanes' queue gauges from JetStream failed; they keep their last values", "err", err)
		case err == nil && failing:
			failing = false
			log.Info("reading the lanes' queue gauges from JetStream works again")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readQueues reads every lane once, each call bounded by timeout; a lane
// whose read fails keeps its last values. It returns the first error.
func readQueues(ctx context.Context, q QueueReader, lanes []string, m *metrics.Metrics, timeout time.Duration) error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	call := func(f func(context.Context) error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := f(cctx); err != nil {
			keep(err)
		}
	}
	var retries, dead map[string]uint64
	call(func(ctx context.Context) (err error) { retries, err = q.RetriesByLane(ctx); return err })
	call(func(ctx context.Context) (err error) { dead, err = q.DeadByLane(ctx); return err })
	if retries == nil || dead == nil {
		return first
	}
	for _, lane := range lanes {
		call(func(ctx context.Context) error {
			d, err := q.Depth(ctx, lane)
			if err != nil {
				return err
			}
			m.SetQueue(lane, metrics.LaneQueue{Backlog: d.Stored, Oldest: d.Oldest, Retrying: retries[lane], Dead: dead[lane]})
			return nil
		})
	}
	return first
}
