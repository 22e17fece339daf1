package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Failed attempts made in place are kept in the key-value bucket
// TriesBucket: entry "<lane>.<stream created>.<stream sequence>" (the lane
// stream's creation time in unix nanoseconds), the count in decimal, so
// that max_attempts holds across restarts and instances.
//
// An ordered key (per_key.ordered) retries a failing job in place: a copy
// at the tail would start after the key's later jobs. The job's message
// stays as it was stored, so its failed attempts are kept beside it: the
// entry (the attempts made in place) is written at each failed attempt,
// read when an instance reads a key's oldest job for the first time (only
// that job can have failed attempts: a failing job holds its key), and
// deleted when the job is settled.
//
// A plain lane's job waits in place when its retry copy cannot be stored;
// its entry (all its failed attempts) is written then, and read and
// cleared as inplace.go says.
//
// The bucket's MaxAge drops an entry whose job left without being settled
// here (purged by hand, or settled while the bucket was unreachable).
const (
	TriesBucket = "THROTTLER_TRIES"
	triesMaxAge = 7 * 24 * time.Hour
	// triesMarkerTTL: how long the marker of a cleared entry stays (a
	// plain KV delete would keep one per settled job for triesMaxAge).
	triesMarkerTTL = time.Second
)

// ensureTries creates or opens TriesBucket, once for every lane of q (with
// the replica count every lane has, nats.replicas): each ensure is a
// create, and an update of the bucket's stream when it exists.
func (q *Queue) ensureTries(ctx context.Context, replicas int) (jetstream.KeyValue, error) {
	replicas = max(replicas, 1)
	q.triesMu.Lock()
	defer q.triesMu.Unlock()
	if q.triesKV != nil && q.triesReplicas == replicas {
		return q.triesKV, nil
	}
	kv, err := ensureKV(ctx, q.js, jetstream.KeyValueConfig{
		Bucket: TriesBucket, Description: "throttler failed attempts of jobs retried in place",
		History: 1, TTL: triesMaxAge, Storage: jetstream.FileStorage, Replicas: replicas,
		LimitMarkerTTL: triesMarkerTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: tries bucket: %w", err)
	}
	q.triesKV, q.triesReplicas = kv, replicas
	return kv, nil
}

// formerTries reports whether kv holds entries of lane under the name
// earlier releases gave them ("<lane>.<stream sequence>": two tokens, which
// this release's three never match). Only then do Tries and ClearTries
// look under that name too, so that a key's first read stays one request.
// A release of the former naming started beside this one after it (a
// rolling upgrade) is not looked for: its counts are then missed, which
// allows a job more attempts, never fewer.
func (q *Queue) formerTries(ctx context.Context, lane string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	st, err := q.js.Stream(ctx, "KV_"+TriesBucket)
	if err != nil {
		return false, fmt.Errorf("queue: tries bucket: %w", err)
	}
	// The first message on a two-token name of the lane, if any.
	_, err = st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject("$KV."+TriesBucket+"."+lane+".*"))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	}
	return false, fmt.Errorf("queue: tries bucket: %w", err)
}

// triesEntry is the entry of the job at seq: "<lane>.<stream created>.<stream
// sequence>", as a plain lane's (inplace.go). The lane stream's creation
// time (unix nanoseconds) keeps apart the jobs of a stream deleted and made
// again (nats stream rm, a switch between keyed and plain), whose sequences
// start again: a count its former jobs left is no count of the new ones.
func (r *KeyedReader) triesEntry(seq uint64) string {
	return r.ls.spec.Name + "." + strconv.FormatInt(r.ls.epoch, 10) + "." + strconv.FormatUint(seq, 10)
}

// formerTriesEntry is the entry of the job at seq as earlier releases name
// it, "<lane>.<stream sequence>". They may still be running beside this one
// (a rolling upgrade): Tries honours such an entry if it was written after
// the lane stream was made, ClearTries clears it too.
func (r *KeyedReader) formerTriesEntry(seq uint64) string {
	return r.ls.spec.Name + "." + strconv.FormatUint(seq, 10)
}

// Tries returns the failed attempts stored for the job at seq (0 for none,
// for an entry that is not a count, or when the lane is not ordered): its
// entry's, else its entry under the former name when that was written
// since the lane stream was made (an older one was left by a job of a
// former stream at the same sequence).
func (r *KeyedReader) Tries(ctx context.Context, seq uint64) (int, error) {
	kv := r.ls.tries
	if kv == nil {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	name := r.triesEntry(seq)
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) && r.ls.formerTries {
		name = r.formerTriesEntry(seq)
		e, err = kv.Get(ctx, name)
		if err == nil && e.Created().UnixNano() < r.ls.epoch {
			return 0, nil
		}
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%w: read tries of %d: %v", ErrUnavailable, seq, err)
	}
	n, err := strconv.Atoi(string(e.Value()))
	if err != nil || n < 0 || n > maxAttempts {
		// Not written by the throttler: failing here would hold the
		// key until the entry lapses. Count from the message instead.
		r.q.log.Warn("ignoring a bad entry in the tries bucket", "bucket", TriesBucket, "entry", name, "value", string(e.Value()))
		return 0, nil
	}
	return n, nil
}

// SetTries stores n failed attempts of the job at seq.
func (r *KeyedReader) SetTries(ctx context.Context, seq uint64, n int) error {
	kv := r.ls.tries
	if kv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	if _, err := kv.Put(ctx, r.triesEntry(seq), []byte(strconv.Itoa(n))); err != nil {
		return fmt.Errorf("%w: store tries of %d: %v", ErrUnavailable, seq, err)
	}
	return nil
}

// ClearTries forgets the failed attempts of the settled job at seq, under
// its entry's name and the former one (Tries may have read that). An entry
// is purged with a marker that lapses after triesMarkerTTL: a plain delete
// would leave one marker per settled job for triesMaxAge. An entry never
// stored is left alone (a purge would write a marker).
func (r *KeyedReader) ClearTries(ctx context.Context, seq uint64) error {
	kv := r.ls.tries
	if kv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	names := []string{r.triesEntry(seq)}
	if r.ls.formerTries {
		names = append(names, r.formerTriesEntry(seq))
	}
	for _, name := range names {
		_, err := kv.Get(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err == nil {
			err = kv.Purge(ctx, name, jetstream.PurgeTTL(triesMarkerTTL))
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("%w: clear tries of %d: %v", ErrUnavailable, seq, err)
		}
	}
	return nil
}
