package lane

import (
	"context"
	"time"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/leaky"
	"github.com/throttler/throttler/internal/queue"
)

// A pull-mode lane (target.nats.mode: pull) hands each job to a worker that
// asked for one. Its drain takes jobs from the queue only while workers wait
// at this instance: a job is never held here while the workers that asked
// for work wait at another instance, and JetStream's MaxAckPending
// (max_inflight) bounds the jobs out across the fleet. Pacing, settling,
// retries and dead letters are the lane's as for any target.

// openTarget opens the lane's target: a pull-mode one (kept in l.pull, for
// the drain's source) or any other through dispatch.Open.
func (l *Lane) openTarget(ctx context.Context) (dispatch.Target, func(), error) {
	if !l.cfg.Target.Pull() {
		tc := targetConfig(l.cfg.Target, l.cfg.MaxInflight, l.d.Handlers)
		if r := l.cfg.Results; r != nil && tc.HTTP != nil {
			tc.HTTP.Capture = &dispatch.Capture{MaxBody: int64(r.MaxBody), Headers: r.Headers}
		}
		return l.d.Targets.Open(ctx, tc)
	}
	n := l.cfg.Target.NATS
	name := l.cfg.Name
	for _, reason := range []string{dispatch.ReplyMalformed, dispatch.ReplyNotInbox, dispatch.ReplyNotWorker} {
		l.d.Metrics.PullRepliesRefused.WithLabelValues(name, reason) // a series from 0, for rate()
	}
	p, err := l.d.Targets.OpenPull(dispatch.PullConfig{Subject: n.Subject, Lease: n.Lease.D(), Logger: l.log,
		Workers: l.d.Workers[name],
		Refused: func(reason string) { l.d.Metrics.PullRepliesRefused.WithLabelValues(name, reason).Inc() }})
	if err != nil {
		return nil, func() {}, err
	}
	l.pull = p
	return p, p.Close, nil
}

// source is the drain's source: the lane's consumer, gated by waiting
// workers in pull mode.
func (l *Lane) source() leaky.Source[*queue.Msg] {
	if l.pull == nil {
		return l.consumer
	}
	return pullSource{consumer: l.consumer, pull: l.pull}
}

// stopPulls answers the workers waiting here once the drain stopped, so
// that they ask another instance at once.
func (l *Lane) stopPulls() {
	if l.pull != nil {
		l.pull.StopPulls()
	}
}

// pullSource takes at most as many jobs from the queue as workers wait here.
type pullSource struct {
	consumer *queue.Consumer
	pull     *dispatch.Pull
}

var _ leaky.Source[*queue.Msg] = pullSource{}

// pullFetchWait bounds one fetch of a pull-mode lane: a short pull request
// at the server, so that the gate is read again soon after the workers
// waiting here went elsewhere.
const pullFetchWait = 500 * time.Millisecond

// Next waits for a worker to ask here, then for up to as many jobs as
// workers wait.
func (s pullSource) Next(ctx context.Context, max int) ([]*queue.Msg, error) {
	idle, err := s.pull.Claim(ctx, max)
	if err != nil {
		return nil, err
	}
	fetchCtx, cancel := context.WithTimeout(ctx, pullFetchWait)
	defer cancel()
	msgs, err := s.consumer.Next(fetchCtx, idle)
	s.pull.Unclaim(idle - len(msgs))
	if err != nil && ctx.Err() == nil && fetchCtx.Err() != nil {
		// Nothing came in time: read the gate again. A job the server
		// sends meanwhile goes back to the queue at once, for an
		// instance where workers wait, rather than staying here.
		s.consumer.HandBack()
		return nil, nil
	}
	return msgs, err
}

// Release implements leaky.Source.
func (s pullSource) Release(msgs []*queue.Msg) { s.consumer.Release(msgs) }
