package redisbucket

import (
	"fmt"
	"strings"

	"github.com/throttler/throttler/internal/bucket"
)

// PeekLua is the start of a script that peeks one GCRA state (Peek) and
// then goes on with checks of its own, so that another package's check and
// a lane's peek are one script run, one round trip (package redisquota
// folds the caller quotas and the lane's decision this way).
//
// KEYS[1] and ARGV[1..7] are the peek's (FoldedPeek.Key and Args); the rest
// belong to the code that follows. It reads every key of the script with
// one MGET: the local pre holds their values (false for a missing key),
// pre[1] the lane's. The code that follows may read pre and now_us (the
// script's now in whole µs since the epoch: Redis TIME, or the store's
// injected clock), and must end its reply with the three values of
// lane_reply(), which FoldedPeek.Decision reads. A lost state is restored
// as by Peek.
//
// All keys of one script must live on one server: fold only on a client
// that is not a Redis Cluster client (a lane's keys carry the lane as their
// hash tag, and no other key shares it).
var PeekLua = foldPrelude() + peekBody + "local function lane_reply()\n  return " + peekReply + "\nend\n"

// foldPrelude is the prelude with the state read by one MGET of every key.
func foldPrelude() string {
	const get = "local cur = redis.call('GET', KEYS[1])\n"
	if !strings.Contains(prelude, get) {
		panic("redisbucket: the prelude no longer reads its state with " + get)
	}
	return strings.Replace(prelude, get, "local pre = redis.call('MGET', unpack(KEYS))\nlocal cur = pre[1]\n", 1)
}

// FoldedPeek is one peek to run inside a script that starts with PeekLua.
// It is used once.
type FoldedPeek struct {
	s   *Store
	k   bucket.Key
	l   bucket.Limit
	key string
}

// Fold prepares a peek of k's state under l for a script that starts with
// PeekLua; errors wrap bucket.ErrInvalidLimit.
func (s *Store) Fold(k bucket.Key, l bucket.Limit) (FoldedPeek, error) {
	if err := checkLimit(l, 1); err != nil {
		return FoldedPeek{}, err
	}
	return FoldedPeek{s: s, k: k, l: l, key: s.Key(k)}, nil
}

// Key is the script's KEYS[1].
func (f FoldedPeek) Key() string { return f.key }

// Args are the script's ARGV[1..7], read now (the store's clock, the
// floor), followed by more, the arguments of the code after PeekLua (in
// one slice: go-redis copies it once more into the command).
func (f FoldedPeek) Args(more ...any) []any {
	f.s.calls.Add(1)
	return append(f.s.args(f.k, f.key, f.l, 0, len(more)), more...)
}

// Decision reads the three values of lane_reply() (the last three of the
// script's reply), raises the store's floor as Peek does, and answers what
// Peek would, relative to the script's now. Its errors wrap
// bucket.ErrUnavailable.
func (f FoldedPeek) Decision(tail []any) (bucket.Decision, error) {
	if len(tail) != 3 {
		return bucket.Decision{}, f.s.fail("peek", f.k, fmt.Errorf("%w: %d values, want {ns, tat, restored}", errReply, len(tail)))
	}
	reply := any(tail) // boxed once for both readers
	rel, err := parseFirst(reply)
	if err == nil {
		err = f.s.see(f.key, reply, rel)
	}
	if err != nil {
		return bucket.Decision{}, f.s.fail("peek", f.k, err)
	}
	return bucket.Peek(refTime, refTime.Add(rel), f.l), nil
}
