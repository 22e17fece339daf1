package lane

import (
	"context"
	"errors"

	"github.com/throttler/throttler/internal/queue"
)

// expire dead-letters msg, whose job passed its expiry before it could
// start (queue/schedule.go), and frees its permit. Its slot is spent: a
// job that expires while it waits in the lane is mostly caught when the
// drain fetches it, before it takes one.
func (l *Lane) expire(dctx context.Context, msg *queue.Msg, done func()) {
	defer done()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(dctx), settleTimeout)
	defer cancel()
	job := msg.Job()
	err := msg.Expire(ctx, l.cfg.Retry.BackoffMax.D())
	if errors.Is(err, queue.ErrAckUnconfirmed) {
		err = nil
	}
	if err != nil {
		l.log.Warn("dead-lettering an expired job failed; it comes back and is checked again", "id", job.ID, "err", err)
		return
	}
	l.d.Metrics.DeadLettered.WithLabelValues(l.cfg.Name).Inc()
	l.log.Info("job expired before it started; dead-lettered", "id", job.ID, "expiry", msg.Expiry())
	l.settledKeyed(dctx, msg)
	l.settled(msg)
}
