package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A job stored without an id of its own (no Idempotency-Key) on a lane
// with job records gets SeqID(prefix, seq) as its id: the prefix is the
// storing instance's (IDPrefixLen random characters and a '.'), seq the
// job's place in its lane's stream. Such an id says where the job is, so
// that it is found by its id (Lookup) while it waits, without a record
// written for it at intake.

// IDPrefixLen is the length of an id prefix, its '.' included.
const IDPrefixLen = 12

// SeqID is the id of the job stored at seq with prefix.
func SeqID(prefix string, seq uint64) string { return prefix + strconv.FormatUint(seq, 10) }

// ValidIDPrefix checks an id prefix: IDPrefixLen-1 letters or digits and a
// '.'.
func ValidIDPrefix(p string) error {
	if len(p) != IDPrefixLen || p[IDPrefixLen-1] != '.' {
		return fmt.Errorf("an id prefix is %d letters or digits and a '.'", IDPrefixLen-1)
	}
	for i := 0; i < IDPrefixLen-1; i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return fmt.Errorf("an id prefix has only letters and digits before its '.'")
		}
	}
	return nil
}

// ParseSeqID splits an id made by SeqID; ok is false for any other id.
func ParseSeqID(id string) (prefix string, seq uint64, ok bool) {
	if len(id) <= IDPrefixLen || ValidIDPrefix(id[:IDPrefixLen]) != nil || strings.HasPrefix(id[IDPrefixLen:], "0") {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(id[IDPrefixLen:], 10, 64)
	if err != nil || seq == 0 {
		return "", 0, false
	}
	return id[:IDPrefixLen], seq, true
}

// ErrNoSuchJob: the lane's stream holds no waiting job with that id.
var ErrNoSuchJob = errors.New("queue: no such job waiting")

// Lookup finds a job with a SeqID id still stored in its lane's stream
// (waiting, or started and not settled), and when it was stored.
func (q *Queue) Lookup(ctx context.Context, lane, id string) (Job, time.Time, error) {
	prefix, seq, ok := ParseSeqID(id)
	if !ok {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	ls, err := q.lane(lane)
	if err != nil {
		return Job{}, time.Time{}, err
	}
	raw, err := ls.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return Job{}, time.Time{}, ErrNoSuchJob
	case err != nil:
		return Job{}, time.Time{}, fmt.Errorf("%w: get %s/%d: %v", ErrUnavailable, lane, seq, err)
	}
	internal, key, ok := subjectKey(lane, raw.Subject)
	if !ok || !internal || raw.Header.Get(HeaderIDPrefix) != prefix {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	job := decodeJob(lane, raw.Header, raw.Data, key, seq, true, time.Now())
	if job.ID != id {
		return Job{}, time.Time{}, ErrNoSuchJob
	}
	return job, raw.Time, nil
}
