package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Retries wait outside their lane. A failed job's copy is stored in
// THROTTLE_RETRY (subject throttle_retry.<lane>) with its Not-Before time; a
// mover per lane puts each copy at the tail of the lane when it is due. So a
// waiting retry holds no place in the lane consumer's MaxAckPending, which
// can then be exactly max_inflight: a global bound on the jobs of a lane in
// flight across every instance.
const (
	RetryStream        = "THROTTLE_RETRY"
	RetrySubjectPrefix = "throttle_retry"
)

// RetrySubject is the subject of a lane's waiting retries.
func RetrySubject(lane string) string { return RetrySubjectPrefix + "." + lane }

func retryConsumerName(lane string) string { return "retry-" + lane }

// RetryConfig bounds the retry stream: a full one refuses a retry copy,
// and the failed job then waits in its lane instead.
type RetryConfig struct {
	MaxMsgs  int64
	MaxBytes int64
	Replicas int
	// DedupWindow is how long the stream remembers a msg id: the lanes'
	// (nats.dedup_window), since a delayed job waits here under a msg id
	// made of its job id (Schedule), and a resubmission within the window
	// must be a duplicate. At least copyDedupWindow.
	DedupWindow time.Duration
}

// copyDedupWindow is the retry stream's shortest de-duplication window:
// it absorbs a copy stored again after a lost ack (copy.go).
const copyDedupWindow = 2 * time.Minute

// EnsureRetries creates or updates the retry stream. Call it before EnsureLane.
func (q *Queue) EnsureRetries(ctx context.Context, cfg RetryConfig) error {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	st, err := ensureStream(ctx, q.js, jetstream.StreamConfig{
		Name:        RetryStream,
		Description: "throttler retries waiting for their time",
		Subjects:    []string{RetrySubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		MaxMsgs:     max(cfg.MaxMsgs, -1),
		MaxBytes:    maxBytes(cfg.MaxBytes),
		Discard:     jetstream.DiscardNew,
		Duplicates:  max(cfg.DedupWindow, copyDedupWindow),
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: retry stream: %w", err)
	}
	q.mu.Lock()
	q.retry = st
	q.mu.Unlock()
	return nil
}

// ensureRetryConsumer creates the lane's mover consumer on the retry stream.
func (q *Queue) ensureRetryConsumer(ctx context.Context, spec LaneSpec) (jetstream.Consumer, error) {
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	if st == nil {
		return nil, errors.New("queue: EnsureRetries must run before EnsureLane")
	}
	c, err := ensureConsumer(ctx, st, jetstream.ConsumerConfig{
		Durable:       retryConsumerName(spec.Name),
		Description:   "throttler retry mover of lane " + spec.Name,
		FilterSubject: RetrySubject(spec.Name),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 100_000,
		MaxDeliver:    -1,
		Replicas:      spec.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: retry consumer for lane %s: %w", spec.Name, err)
	}
	return c, nil
}

// Retry counts a failed attempt and stores a copy of the job to be queued
// again, behind the lane's backlog, no earlier than delay from now. The copy
// carries the same job id, and a msg id of its own event (copy.go); the
// original is acked only after the copy is stored, so a crash in between
// can only duplicate the job, never lose it. When the copy cannot be
// stored, or another message holds its msg id (ErrNotTheCopy), the job
// waits in place instead and is delivered again after delay, its failed
// attempt counted in place (inplace.go). An error
// wrapping ErrAckUnconfirmed means the copy is stored and only the
// original's ack was not confirmed.
func (m *Msg) Retry(ctx context.Context, delay time.Duration) error {
	defer m.c.settle(m)
	job := m.job
	job.Notify, job.NotifyID = "", ""
	job.RecordRev = 0         // the record changed since; the claim reads it
	job.Expires = time.Time{} // it started: no longer expires
	job.Attempts++
	job.NotBefore = time.Now().Add(delay)
	job.MsgID = m.retryMsgID()
	msg := jobMsg(job)
	msg.Subject = RetrySubject(job.Lane)
	if job.Key != "" {
		msg.Header.Set(HeaderKey, job.Key)
	}
	q := m.c.q
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	if st == nil {
		m.c.failedInPlace(ctx, m, job.Attempts)
		_ = m.m.NakWithDelay(delay)
		return fmt.Errorf("queue: store retry of %s: %w: EnsureRetries did not run", job.ID, ErrUnavailable)
	}
	if err := q.storeCopy(ctx, st, msg); err != nil {
		// It waits in place, its failed attempt counted here
		// (inplace.go): its message cannot say so.
		m.c.failedInPlace(ctx, m, job.Attempts)
		_ = m.m.NakWithDelay(delay)
		return fmt.Errorf("queue: store retry of %s: %w", job.ID, err)
	}
	m.c.leftLane(m)
	// A confirmed ack, on this path that already waited for a store:
	// a plain one lost at a stop would leave the original to be
	// delivered again beside its copy.
	return confirmAck(ctx, m.m)
}

// MoveRetries puts the lane's retries into the lane as they fall due, until
// ctx ends. Every instance runs one; the shared consumer hands each retry to
// one of them, and the lane's de-duplication absorbs a move repeated after a
// crash.
func (q *Queue) MoveRetries(ctx context.Context, lane string, log *slog.Logger) {
	ls, err := q.lane(lane)
	if err != nil || ls.retry == nil {
		return
	}
	for ctx.Err() == nil {
		batch, err := ls.retry.Fetch(64, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() == nil {
				log.Debug("retry fetch failed", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for m := range batch.Messages() {
			q.moveOne(ctx, lane, m, log)
		}
	}
}

func (q *Queue) moveOne(ctx context.Context, lane string, m jetstream.Msg, log *slog.Logger) {
	meta, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	now := time.Now()
	job := decodeJob(lane, m.Headers(), m.Data(), m.Headers().Get(HeaderKey), meta.Sequence.Stream, true, now)
	if !job.Expires.IsZero() && !now.Before(job.Expires) {
		// A delayed job whose expiry came first: never enters the lane.
		q.expireWaiting(ctx, job, m, meta)
		return
	}
	wake := job.NotBefore
	if !job.Expires.IsZero() && job.Expires.Before(wake) {
		wake = job.Expires
	}
	if wait := wake.Sub(now); wait > notBeforeSlack {
		_ = m.NakWithDelay(wait)
		return
	}
	job.MsgID = m.Headers().Get(jetstream.MsgIDHeader)
	job.NotBefore = time.Time{}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	if err := q.republish(pctx, job); err != nil {
		log.Warn("moving a due retry into its lane failed; trying again in 1s", "id", job.ID, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	_ = m.Ack()
	if h := q.hook.get(); h != nil && job.Attempts == 0 {
		// A delayed job (a retry has failed attempts).
		h.Entered(lane, job.ID)
	}
}

// RetriesWaiting counts the lane's retries and delayed jobs not yet due
// (both wait in the retry stream).
func (q *Queue) RetriesWaiting(ctx context.Context, lane string) (uint64, error) {
	ls, err := q.lane(lane)
	if err != nil || ls.retry == nil {
		return 0, err
	}
	ci, err := ls.retry.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: retry consumer %s: %v", ErrUnavailable, lane, err)
	}
	return ci.NumPending + uint64(ci.NumAckPending), nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
