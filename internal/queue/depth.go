package queue

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Depth is a lane's stored jobs as its stream counts them, for the whole
// fleet.
type Depth struct {
	// Stored: jobs waiting or in flight.
	Stored uint64
	// Oldest is when the oldest of them was stored (JetStream's clock);
	// zero when the lane holds none.
	Oldest time.Time
}

// Depth reads the lane's stored jobs and the oldest one's store time: one
// stream info (two on a keyed lane, whose intake stream counts too). A lane's stream keeps a job until it is settled, so the
// first message is the oldest job waiting or in flight.
func (q *Queue) Depth(ctx context.Context, lane string) (Depth, error) {
	ls, err := q.lane(lane)
	if err != nil {
		return Depth{}, err
	}
	info, err := ls.stream.Info(ctx)
	if err != nil {
		return Depth{}, fmt.Errorf("%w: stream info %s: %v", ErrUnavailable, lane, err)
	}
	d := Depth{Stored: info.State.Msgs}
	if d.Stored > 0 {
		d.Oldest = info.State.FirstTime
	}
	if ls.in != nil {
		// A keyed lane's jobs published and not yet moved onto their
		// keys wait in its intake stream: backlog too, and older than
		// the lane stream's when the lane stream is full.
		ii, err := ls.in.Info(ctx)
		if err != nil {
			return Depth{}, fmt.Errorf("%w: intake stream info %s: %v", ErrUnavailable, lane, err)
		}
		if n := ii.State.Msgs; n > 0 {
			d.Stored += n
			if d.Oldest.IsZero() || ii.State.FirstTime.Before(d.Oldest) {
				d.Oldest = ii.State.FirstTime
			}
		}
	}
	return d, nil
}

// RetriesByLane counts every lane's retries not yet moved back into their
// lane, by lane, in one call (the retry stream's message count per
// subject).
func (q *Queue) RetriesByLane(ctx context.Context) (map[string]uint64, error) {
	q.mu.Lock()
	st := q.retry
	q.mu.Unlock()
	return countBySubject(ctx, st, RetrySubjectPrefix)
}

// DeadByLane counts every lane's dead letters, by lane, in one call (the
// dead-letter stream's message count per subject).
func (q *Queue) DeadByLane(ctx context.Context) (map[string]uint64, error) {
	q.mu.Lock()
	st := q.dead
	q.mu.Unlock()
	return countBySubject(ctx, st, DeadSubjectPrefix)
}

// countBySubject reads the messages per subject prefix.<lane> of st.
func countBySubject(ctx context.Context, st jetstream.Stream, prefix string) (map[string]uint64, error) {
	if st == nil {
		return nil, fmt.Errorf("queue: stream of %s.> not set up", prefix)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+".>"))
	if err != nil {
		return nil, fmt.Errorf("%w: stream info of %s.>: %v", ErrUnavailable, prefix, err)
	}
	out := make(map[string]uint64, len(info.State.Subjects))
	for subject, n := range info.State.Subjects {
		if lane, ok := strings.CutPrefix(subject, prefix+"."); ok {
			out[lane] += n
		}
	}
	return out, nil
}
