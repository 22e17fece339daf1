package queue

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Failed attempts of jobs waiting in place.
//
// A failed job whose retry copy cannot be stored (the retry stream is full
// or JetStream failed) waits in place, in its lane, and its message still
// says the attempts it had before. Its consumer counts the failed attempt
// here, by the message's stream sequence, and the job's next delivery
// carries it: so the lane's max_attempts is reached and the job
// dead-lettered while the retry stream stays full, instead of the target
// getting it again and again as the same attempt.
//
// On a plain lane the count is also stored in TriesBucket (entry
// "<lane>.<stream created>.<stream sequence>", the job's failed attempts in
// decimal), so it holds across instances and restarts. The stream's
// creation time (unix nanoseconds) keeps apart the jobs of a lane stream
// deleted and made again, whose sequences start again: a count its former
// jobs left is no count of the new ones. Only this path touches the bucket:
//   - a failed attempt that waits in place writes its count;
//   - a delivery reads it only when the job was delivered before
//     (NumDelivered > 1) and this instance did not see the delivery just
//     before it: a count can only be written by the instance a delivery
//     went to, so after consecutive deliveries here the count kept here is
//     the whole count (a job waiting out a rate limit here reads once);
//   - a job that leaves the lane purges the entry it is known to have.
//
// The local map caches the counts (and the counts known to be none), at
// most maxInPlace of them, any one dropped to make room (most likely a job
// another instance settled): a dropped one is read again. When the bucket
// cannot be read or written, the count kept here is used (logged), and the
// bucket is left alone for triesBackoff; nothing waits on it. An entry whose
// job left without being purged (settled while the bucket was unreachable,
// or purged by hand) lapses with the bucket's MaxAge.
//
// A keyed lane (not ordered) counts in place on the instance that holds the
// key only: its jobs carry no delivery count, and reading the bucket at
// every key's first read would cost a store call per key taken.

// maxInPlace bounds the counts a consumer keeps.
const maxInPlace = 10_000

// triesBackoff is how long a consumer leaves the bucket alone after a call
// to it failed; triesTimeout bounds one call.
const (
	triesBackoff = 5 * time.Second
	triesTimeout = time.Second
)

// inPlaceCount is what a consumer knows of one job's failed attempts in place.
type inPlaceCount struct {
	// attempts: its failed attempts, the message's included; 0: none
	// counted in place.
	attempts int
	// seen is the delivery (NumDelivered) at which attempts was the whole
	// count; 0 on a lane without the bucket.
	seen uint64
	// stored: the bucket may hold an entry for it.
	stored bool
}

// inPlaceTries is the bucket of a consumer's in-place counts (nil: none,
// counted here only) and when it may be used again after a failure.
type inPlaceTries struct {
	kv        jetstream.KeyValue
	epoch     int64        // the lane stream's creation time, in its entries
	downUntil atomic.Int64 // unix nanoseconds
	reads     atomic.Uint64
}

func (c *Consumer) triesEntry(seq uint64) string {
	return c.lane + "." + strconv.FormatInt(c.tries.epoch, 10) + "." + strconv.FormatUint(seq, 10)
}

// bucket is the tries bucket when it may be used now.
func (c *Consumer) bucket() jetstream.KeyValue {
	if c.tries.kv == nil || time.Now().UnixNano() < c.tries.downUntil.Load() {
		return nil
	}
	return c.tries.kv
}

// bucketFailed leaves the bucket alone for triesBackoff after err.
func (c *Consumer) bucketFailed(what string, seq uint64, err error) {
	c.tries.downUntil.Store(time.Now().Add(triesBackoff).UnixNano())
	c.q.log.Warn("the tries bucket failed; this instance counts the job's failed attempts in place alone for now",
		"bucket", TriesBucket, "op", what, "lane", c.lane, "seq", seq, "retry_in", triesBackoff.String(), "err", err)
}

// remember stores e for seq; the caller holds mu.
func (c *Consumer) remember(seq uint64, e inPlaceCount) {
	if c.inPlace == nil {
		c.inPlace = map[uint64]inPlaceCount{}
	}
	if _, ok := c.inPlace[seq]; !ok && len(c.inPlace) >= maxInPlace {
		// Full (jobs other instances settled meanwhile): one entry
		// goes, whichever the map gives first, in O(1) under the
		// consumer's lock.
		for s := range c.inPlace {
			delete(c.inPlace, s)
			break
		}
	}
	c.inPlace[seq] = e
	c.inPlaceN.Store(int64(len(c.inPlace)))
}

// failedInPlace counts a failed attempt of m's job, which waits in place:
// attempts is its failed attempts now. The count is stored in the bucket
// before the job is handed back, so its next delivery reads it anywhere.
func (c *Consumer) failedInPlace(ctx context.Context, m *Msg, attempts int) {
	seq := m.Seq()
	kv := c.bucket()
	c.mu.Lock()
	c.remember(seq, inPlaceCount{attempts: attempts, seen: m.meta.NumDelivered, stored: c.tries.kv != nil})
	c.mu.Unlock()
	if kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), triesTimeout)
	defer cancel()
	if _, err := kv.Put(ctx, c.triesEntry(seq), []byte(strconv.Itoa(attempts))); err != nil {
		c.bucketFailed("store", seq, err)
	}
}

// attemptsInPlace is the failed attempts counted in place of the job at
// seq, delivered for the delivered-th time (0: read by key, which counts
// here only); 0 for none.
func (c *Consumer) attemptsInPlace(seq, delivered uint64) int {
	if delivered <= 1 || c.tries.kv == nil {
		// Never delivered before (or counted here only): what is kept
		// here, if anything.
		if c.inPlaceN.Load() == 0 {
			return 0 // the drain's path: no lock taken
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.inPlace[seq].attempts
	}
	c.mu.Lock()
	e, ok := c.inPlace[seq]
	if ok && e.seen != 0 && e.seen+1 >= delivered {
		// This instance had the delivery before: no other wrote since.
		e.seen = delivered
		c.inPlace[seq] = e
		c.mu.Unlock()
		return e.attempts
	}
	c.mu.Unlock()
	n, found, err := c.readTries(seq)
	if err != nil {
		return e.attempts // logged; read again at the next delivery
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e = c.inPlace[seq]
	e.attempts = max(e.attempts, n)
	e.seen = max(e.seen, delivered)
	e.stored = e.stored || found
	c.remember(seq, e)
	return e.attempts
}

// readTries reads the bucket's count of the job at seq.
func (c *Consumer) readTries(seq uint64) (n int, found bool, err error) {
	kv := c.bucket()
	if kv == nil {
		return 0, false, errors.New("left alone after a failure")
	}
	c.tries.reads.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), triesTimeout)
	defer cancel()
	e, err := kv.Get(ctx, c.triesEntry(seq))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		c.bucketFailed("read", seq, err)
		return 0, false, err
	}
	n, err = strconv.Atoi(string(e.Value()))
	if err != nil || n < 0 || n > maxAttempts {
		// Not written by the throttler: count from the message.
		c.q.log.Warn("ignoring a bad entry in the tries bucket", "bucket", TriesBucket, "entry", c.triesEntry(seq), "value", string(e.Value()))
		return 0, true, nil
	}
	return n, true, nil
}

// leftLane forgets the count of m's job: it left the lane. Its entry in
// the bucket, if it may have one, is purged with a marker that lapses
// after triesMarkerTTL.
func (c *Consumer) leftLane(m *Msg) {
	if c.inPlaceN.Load() == 0 {
		return
	}
	seq := m.Seq()
	c.mu.Lock()
	e, ok := c.inPlace[seq]
	delete(c.inPlace, seq)
	c.inPlaceN.Store(int64(len(c.inPlace)))
	c.mu.Unlock()
	if !ok || !e.stored {
		return
	}
	kv := c.bucket()
	if kv == nil {
		c.q.log.Debug("a settled job's failed attempts stay in the tries bucket until they lapse", "lane", c.lane, "seq", seq)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), triesTimeout)
	defer cancel()
	if err := kv.Purge(ctx, c.triesEntry(seq), jetstream.PurgeTTL(triesMarkerTTL)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		c.bucketFailed("clear", seq, err)
	}
}
