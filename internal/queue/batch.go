package queue

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// BatchResult is JetStream's answer to one job of a PublishBatch: a
// PubResult, or Err (ErrBacklogFull, ErrFull or ErrUnavailable, wrapped)
// when that job was not stored.
type BatchResult struct {
	PubResult
	Err error
}

// MaxBatchWindow bounds the asynchronous publishes a PublishBatch keeps
// waiting for their acknowledgements at once; a larger batch is published
// in windows of this size, one after the other.
const MaxBatchWindow = 1024

// PublishBatch stores jobs of one lane in order, as asynchronous
// publishes in one window (jetstream PublishMsgAsync), and waits for every
// acknowledgement. The answer has one BatchResult per job, in order; each
// job stands alone: one refused (the lane at its max_backlog, storage full)
// does not undo the others, and a job with a nil Err is stored durably (or
// a duplicate of a stored one). A missing deadline gets publishTimeout.
//
// Jobs are published on one connection in order, so they are stored in
// order; JetStream may refuse one and store the next (a job drained in
// between makes room).
func (q *Queue) PublishBatch(ctx context.Context, lane string, jobs []Job) ([]BatchResult, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return nil, err
	}
	out := make([]BatchResult, len(jobs))
	if !q.nc.IsConnected() {
		err := fmt.Errorf("lane %s: %w: not connected to NATS (%v)", lane, ErrUnavailable, q.nc.Status())
		for i := range out {
			out[i].Err = err
		}
		return out, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, publishTimeout)
		defer cancel()
	}
	stored := 0
	for lo := 0; lo < len(jobs); lo += MaxBatchWindow {
		hi := min(lo+MaxBatchWindow, len(jobs))
		futures := make([]jetstream.PubAckFuture, hi-lo)
		for i := lo; i < hi; i++ {
			job := jobs[i]
			if job.Lane != lane {
				out[i].Err = fmt.Errorf("%w: job %s is of lane %q, not %q", ErrUnknownLane, job.ID, job.Lane, lane)
				continue
			}
			msg := jobMsg(job)
			f, err := q.js.PublishMsgAsync(msg)
			if err != nil {
				out[i].Err = fmt.Errorf("lane %s: %w", lane, q.classify(ctx, msg.Subject, err))
				continue
			}
			futures[i-lo] = f
		}
		for i, f := range futures {
			if f == nil {
				continue
			}
			r := &out[lo+i]
			acked := func(ack *jetstream.PubAck) {
				r.Seq, r.Duplicate = ack.Sequence, ack.Duplicate
				if !ack.Duplicate {
					stored++
					// A keyed lane's runtime hears the key at once, as
					// for a single job (else only its sweep finds a key
					// that had nothing waiting).
					ls.stored(jobs[lo+i].Key)
				}
			}
			// Most acks of a window are in by the time the wait reaches
			// them: take those without making the future's error channel.
			ok := f.Ok()
			select {
			case ack := <-ok:
				acked(ack)
				continue
			default:
			}
			select {
			case ack := <-ok:
				acked(ack)
			case err := <-f.Err():
				r.Err = fmt.Errorf("lane %s: %w", lane, q.classify(ctx, f.Msg().Subject, err))
			case <-ctx.Done():
				// The job may still be stored: the caller must not report
				// success for it, and a resubmission is de-duplicated.
				r.Err = fmt.Errorf("lane %s: %w: no acknowledgement: %v", lane, ErrUnavailable, ctx.Err())
			}
		}
	}
	if stored > 0 {
		ls.mu.Lock()
		ls.confirmed += uint64(stored)
		ls.mu.Unlock()
	}
	return out, nil
}
