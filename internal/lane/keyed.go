package lane

import (
	"context"
	"sync"
	"time"

	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/queue"
)

// A keyed lane (per_key) is paced by keyed.Pacer, as an unkeyed one is by
// leaky.Drain: this file only adapts the queue and the lane's state to the
// pacer's interfaces.

// keyedReader is the queue's keyed reader as keyed.Reader sees it.
type keyedReader struct{ *queue.KeyedReader }

var _ keyed.Reader[*queue.Msg] = keyedReader{}

// Next implements keyed.Reader.
func (r keyedReader) Next(ctx context.Context, key string, from uint64) (*queue.Msg, bool, error) {
	m, err := r.KeyedReader.Next(ctx, key, from)
	return m, m != nil, err
}

// newKeyed builds the keyed lane's pacer and hooks it to the queue: a job
// stored by this instance, or handed back to wait in place, tells it.
func (l *Lane) newKeyed() (*keyed.Pacer[*queue.Msg], error) {
	name := l.cfg.Name
	r, err := l.d.Queue.KeyedReader(name)
	if err != nil {
		return nil, err
	}
	cfg := keyed.Config[*queue.Msg]{
		Lane: name, Reader: keyedReader{r}, Pair: l.d.Pair, Claims: l.d.Claims, Leases: l.d.Leases, Slow: l.d.Slow,
		Start: l.start, Assigned: l.assigned, Held: l.hold.held, LaneLimit: l.EffectiveLimit, KeyLimit: l.keyLimit, KeyOpts: l.keyOpts,
		MaxInflight: l.cfg.MaxInflight, Ordered: l.cfg.PerKey.Ordered, MaxPause: l.bounds.MaxPause,
		Instance: l.d.Instance, Clock: l.d.Clock, Logger: l.log, Observer: (*observer)(l),
	}
	if l.d.Store != nil {
		cfg.Pauser = l.d.Store
	}
	if a := l.cfg.PerKey.Adaptive; a.Enabled {
		cfg.Adaptive = &keyed.Slowdown{Decrease: a.Decrease, Increase: a.Increase, Min: a.Min, Interval: a.Interval.D()}
	}
	if l.pull != nil {
		cfg.Workers, cfg.Backlog = l.pull, l.d.Queue
	}
	p, err := keyed.NewPacer(cfg)
	if err != nil {
		return nil, err
	}
	r.OnRequeue = p.Requeue
	// Read ahead only the keys this instance has held since before the
	// read: another instance may settle the others' jobs.
	r.Holds = func(key string, since time.Time) bool {
		st := p.Key(key)
		return st.Known && st.Since.Before(since)
	}
	l.d.Queue.OnStored(name, p.Announce)
	l.keyedQ = r
	return p, nil
}

// runKeyed drives a keyed lane until ctx ends, with its intake and retry
// mover beside it, then waits for its dispatches and for the deletes of
// the jobs they settled.
func (l *Lane) runKeyed(ctx, dispatch context.Context) {
	var helpers sync.WaitGroup
	helpers.Go(func() { l.d.Queue.RunIntake(ctx, l.cfg.Name, l.log) })
	helpers.Go(func() { l.d.Queue.MoveRetries(ctx, l.cfg.Name, l.log) })
	l.keyed.Run(ctx, dispatch)
	helpers.Wait()
	l.keyedQ.WaitDeletes()
	l.keyedQ.Close()
}

// retryInPlace holds an ordered key's failing job in place for d, counting
// the attempt (a retry behind the key's later jobs would break their
// order).
func (l *Lane) retryInPlace(dctx context.Context, msg *queue.Msg, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(dctx), settleTimeout)
	defer cancel()
	if n, err := l.keyed.RetryInPlace(ctx, msg.Job().Key, msg, d); err != nil {
		l.log.Warn("storing an ordered job's failed attempts failed; a restart counts them from its message", "id", msg.Job().ID, "tries", n, "err", err)
	}
}

// settledKeyed forgets a keyed job's in-place attempts once it left the
// stream.
func (l *Lane) settledKeyed(dctx context.Context, msg *queue.Msg) {
	if l.keyed == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(dctx), settleTimeout)
	defer cancel()
	if err := l.keyed.Settled(ctx, msg); err != nil {
		l.log.Warn("forgetting a settled ordered job's failed attempts failed; the entry lapses by itself", "id", msg.Job().ID, "err", err)
	}
}
