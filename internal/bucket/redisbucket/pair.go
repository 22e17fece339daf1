package redisbucket

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
)

// pairScript reserves one slot of a keyed lane (bucket.ReservePair): KEYS[1]
// is the lane's state (with the prelude's arguments and floor), KEYS[2] the
// key's; ARGV[4] is the key's allowed lead over the lane in ns, ARGV[7] the
// prelude's held (the lane's), ARGV[8] and ARGV[9] the key's period and
// tolerance in ns, ARGV[10] the lateness to carry into the key's state
// first in ns (stored only with the slot), ARGV[11] the caller's floor of
// the key's state. Both states are restored from their
// floors as in the prelude (a key is read by one instance at a time, its
// claimer, whose floor covers every slot of it: no held slots are added);
// without a key floor a key whose state Redis lost would start with a full
// bucket, a burst too many for that key. It returns {ok, due, key next,
// lane next, key latest, key tat', lane tat', restored} (ns from now; the
// tats in the state format, the key's empty when it was not written).
var pairScript = redis.NewScript(prelude + `
local kperiod = tonumber(ARGV[8])
local ktau = tonumber(ARGV[9])
local carry = tonumber(ARGV[10])
local krel = 0
local kcur = redis.call('GET', KEYS[2])
if kcur then
  krel = ahead(kcur)
  if not krel then
    return redis.error_reply('ERR redisbucket: unreadable state ' .. KEYS[2])
  end
  if carry > 0 then krel = krel + carry end
end
do
  local r, err = lost(11, 'key floor', kcur, krel, ktau, kperiod)
  if err then return redis.error_reply(err) end
  if r then
    -- Written back at once, as the lane's state is, so that the next call
    -- finds it (and counts no second restore) with or without a slot.
    krel = r
    -- The key's restore is told apart from the lane's (1): 2.
    restored = restored + 2
    store(krel, KEYS[2])
  end
end
local el = rel - tau
if el < 0 then el = 0 end
local ek = krel - ktau
if ek < 0 then ek = 0 end
if ek - el > arg then
  return {0, '0', num(ek), num(el), '0', '', tail(rel)}
end
local due = math.max(el, ek)
local lrel = math.max(rel, due) + period
local nk = math.max(krel, due) + kperiod
store(lrel)
-- nk > 0 (the key's period is at least 1 ns): store sets, never deletes.
store(nk, KEYS[2])
local kstate = state(nk)
return {1, num(due), num(math.max(nk - ktau, 0)), num(math.max(lrel - tau, 0)), num(nk - kperiod), kstate, tail(lrel)}
`)

var _ bucket.PairStore = (*Store)(nil)

// ReservePair implements bucket.PairStore: one slot of key k under both its
// own limit kl and the lane-wide limit ll, in one script call (both keys
// share the lane's hash tag).
func (s *Store) ReservePair(ctx context.Context, k bucket.Key, ll, kl bucket.Limit, ahead, carry time.Duration) (bucket.PairReservation, error) {
	if err := checkLimit(ll, 1); err != nil {
		return bucket.PairReservation{}, err
	}
	if err := checkLimit(kl, 1); err != nil {
		return bucket.PairReservation{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	lane, laneKey, keyKey := bucket.Key{Lane: k.Lane}, s.Key(bucket.Key{Lane: k.Lane}), s.Key(k)
	s.calls.Add(1)
	args := append(s.args(lane, laneKey, ll, int64(max(ahead, bucket.PairSlack)), 4),
		int64(kl.Period()), int64(kl.Tolerance()), int64(max(carry, 0)), s.floors.get(keyKey))
	reply, err := pairScript.Run(ctx, s.client, []string{laneKey, keyKey}, args...).Result()
	if err != nil {
		return bucket.PairReservation{}, s.fail("reserve-pair", k, err)
	}
	a, ok := reply.([]any)
	if !ok || len(a) != 8 {
		return bucket.PairReservation{}, s.fail("reserve-pair", k, fmt.Errorf("%w %T %v, want {ok, due, key next, lane next, key latest, key tat, tat, restored}", errReply, reply, reply))
	}
	flag, ok := a[0].(int64)
	if !ok || (flag != 0 && flag != 1) {
		return bucket.PairReservation{}, s.fail("reserve-pair", k, fmt.Errorf("%w %T %v as the ok flag", errReply, a[0], a[0]))
	}
	var r bucket.PairReservation
	r.OK = flag == 1
	for i, p := range []*timeDuration{{&r.Due}, {&r.KeyNext}, {&r.LaneNext}, {&r.KeyLatest}} {
		if *p.d, err = parseDuration(a[i+1]); err != nil {
			return bucket.PairReservation{}, s.fail("reserve-pair", k, err)
		}
	}
	r.Free = r.OK && r.Due == 0
	// The restored flag: 1 the lane's state, 2 the key's, 3 both. see
	// reads the lane's; the key's is told here, under the key's name.
	if flag, ok := a[7].(int64); ok && flag >= 2 && flag <= 3 {
		a[7] = flag - 2
		s.floors.restored.Add(1)
		s.log.Warn("key state missing in Redis although this instance saw it ahead of now: Redis lost data "+
			"(a restart without persistence, a failover?); restored as an empty bucket", "key", keyKey)
	}
	if err := s.see(laneKey, reply, r.LaneNext+ll.Tolerance()); err != nil {
		return bucket.PairReservation{}, s.fail("reserve-pair", k, err)
	}
	// The key's floor: its new tat, written only with a slot.
	if kstate, ok := a[5].(string); !ok {
		return bucket.PairReservation{}, s.fail("reserve-pair", k, fmt.Errorf("%w %T %v as the key's tat, want a string", errReply, a[5], a[5]))
	} else if kstate != "" {
		ns, ok := parseState(kstate)
		if !ok {
			return bucket.PairReservation{}, s.fail("reserve-pair", k, fmt.Errorf("%w %q as the key's tat, want µs.nnn", errReply, kstate))
		}
		s.floors.raise(keyKey, ns, kstate, r.KeyLatest+kl.Period())
	}
	return r, nil
}

type timeDuration struct{ d *time.Duration }
