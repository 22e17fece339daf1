// Package redisclaims keeps keyed lanes' key claims in Redis, for a fleet of
// instances sharing one Redis (keyed.Claims).
//
// Keys, all under the lane's hash tag (Redis Cluster): "<prefix>:{<lane>}:alive",
// a hash of instance id → liveness deadline (Unix ms, Redis TIME), refreshed
// by every call of the instance; and "<prefix>:{<lane>}:own:<key>", the id of
// the instance that reads the key's jobs, with a TTL (Lease) refreshed by
// its owner. A key is free when its owner key is missing, or names an
// instance whose liveness deadline has passed: a crashed instance's keys are
// taken over within Alive. An idle key has no Redis key at all.
package redisclaims

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/keyed"
)

// rediser is what the claims need of a Redis client.
type rediser interface {
	redis.Scripter
}

// Config configures Claims.
type Config struct {
	// Prefix starts every Redis key; default "thr".
	Prefix string
	// Instance is this instance's id.
	Instance string
	// Alive is how long an instance counts as alive after its last call;
	// default 10s. Instances call at least every Alive/5 (Refresh).
	Alive time.Duration
	// Lease is how long an owner key lives without a refresh; default 10m.
	Lease time.Duration
	// Timeout bounds a call without a deadline; default 1s.
	Timeout time.Duration
	// InflightLease is how long an in-flight lease (keyed.Leases) lives
	// without a refresh; default 15s. Holders refresh at least every
	// InflightLease/3.
	InflightLease time.Duration
}

// Claims implements keyed.Claims on Redis. Safe for concurrent use.
type Claims struct {
	c   rediser
	cfg Config

	// Per lane, the in-flight leases taken and given back at the same
	// time go in one script call each (combiner).
	mu       sync.Mutex
	acquires map[string]*combiner[acquireReq, keyed.Full]
	releases map[string]*combiner[releaseReq, struct{}]
}

var _ keyed.Claims = (*Claims)(nil)

// New returns Claims on client; it starts nothing.
func New(client rediser, cfg Config) *Claims {
	if cfg.Prefix == "" {
		cfg.Prefix = "thr"
	}
	if cfg.Alive <= 0 {
		cfg.Alive = 10 * time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 10 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.InflightLease <= 0 {
		cfg.InflightLease = 15 * time.Second
	}
	return &Claims{c: client, cfg: cfg, acquires: map[string]*combiner[acquireReq, keyed.Full]{}, releases: map[string]*combiner[releaseReq, struct{}]{}}
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func (c *Claims) head(lane string) string {
	return c.cfg.Prefix + ":{" + tagEscaper.Replace(lane) + "}:"
}

// claimScript: KEYS[1] the alive hash, KEYS[2..] owner keys; ARGV[1] this
// instance, ARGV[2] lease ms, ARGV[3] alive ms. It returns the indexes
// (from 1) of the owner keys it holds for the instance.
var claimScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local alive = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], now + alive)
redis.call('PEXPIRE', KEYS[1], alive * 6)
local got = {}
for i = 2, #KEYS do
  local o = redis.call('GET', KEYS[i])
  local free = (not o) or o == ARGV[1]
  if not free then
    local dl = redis.call('HGET', KEYS[1], o)
    free = (not dl) or tonumber(dl) < now
  end
  if free then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    got[#got + 1] = i - 1
  end
end
return got
`)

// releaseScript deletes KEYS[1] if ARGV[1] holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
`)

// batch bounds the keys of one script call.
const batch = 500

// Claim implements keyed.Claims.
func (c *Claims) Claim(ctx context.Context, lane string, keys []string) ([]string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	head := c.head(lane)
	var got []string
	for first := true; first || len(keys) > 0; first = false {
		n := min(len(keys), batch)
		part := keys[:n]
		keys = keys[n:]
		rk := make([]string, 0, n+1)
		rk = append(rk, head+"alive")
		for _, k := range part {
			rk = append(rk, head+"own:"+k)
		}
		reply, err := claimScript.Run(ctx, c.c, rk, c.cfg.Instance, c.cfg.Lease.Milliseconds(), c.cfg.Alive.Milliseconds()).Int64Slice()
		if err != nil {
			return got, fmt.Errorf("redisclaims: claim keys of %s: %w", lane, err)
		}
		for _, i := range reply {
			if i < 1 || int(i) > len(part) {
				return got, fmt.Errorf("redisclaims: claim keys of %s: index %d out of range", lane, i)
			}
			got = append(got, part[i-1])
		}
	}
	return got, nil
}

// Release implements keyed.Claims.
func (c *Claims) Release(ctx context.Context, lane, key string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	if err := releaseScript.Run(ctx, c.c, []string{c.head(lane) + "own:" + key}, c.cfg.Instance).Err(); err != nil {
		return fmt.Errorf("redisclaims: release %s/%s: %w", lane, key, err)
	}
	return nil
}

var _ keyed.SlowStore = (*Claims)(nil)

// Keys' slow-downs (per_key.adaptive) are "<prefix>:{<lane>}:slow:<key>" =
// "1 <factor> <ttl ms>" (version 1), with that TTL: how long the factor
// takes to recover. Its age is the TTL it was stored with less the TTL
// left, so it needs no instance's clock.

// saveSlowScript sets KEYS[1] to ARGV[1] for ARGV[2] ms.
var saveSlowScript = redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 0
`)

// loadSlowScript returns, for each of KEYS, its value (false when missing)
// and its TTL left in ms.
var loadSlowScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS do
  out[#out + 1] = redis.call('GET', KEYS[i])
  out[#out + 1] = redis.call('PTTL', KEYS[i])
end
return out
`)

// SaveSlow implements keyed.SlowStore.
func (c *Claims) SaveSlow(ctx context.Context, lane, key string, factor float64, ttl time.Duration) error {
	if ttl < time.Millisecond || !(factor > 0 && factor < 1) {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	v := "1 " + strconv.FormatFloat(factor, 'g', -1, 64) + " " + strconv.FormatInt(ttl.Milliseconds(), 10)
	if err := saveSlowScript.Run(ctx, c.c, []string{c.head(lane) + "slow:" + key}, v, ttl.Milliseconds()).Err(); err != nil && err != redis.Nil {
		return fmt.Errorf("redisclaims: save slow-down of %s/%s: %w", lane, key, err)
	}
	return nil
}

// LoadSlow implements keyed.SlowStore. A value it cannot read is skipped
// (the key runs at its full rate, as after a recovery).
func (c *Claims) LoadSlow(ctx context.Context, lane string, keys []string) ([]keyed.SlowState, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	head := c.head(lane)
	var out []keyed.SlowState
	for len(keys) > 0 {
		n := min(len(keys), batch)
		part := keys[:n]
		keys = keys[n:]
		rk := make([]string, n)
		for i, k := range part {
			rk[i] = head + "slow:" + k
		}
		reply, err := loadSlowScript.Run(ctx, c.c, rk).Slice()
		if err != nil {
			return out, fmt.Errorf("redisclaims: load slow-downs of %s: %w", lane, err)
		}
		if len(reply) != 2*n {
			return out, fmt.Errorf("redisclaims: load slow-downs of %s: %d values for %d keys", lane, len(reply), n)
		}
		for i, k := range part {
			v, ok := reply[2*i].(string)
			left, ok2 := reply[2*i+1].(int64)
			if !ok || !ok2 || left <= 0 {
				continue
			}
			if s, ok := parseSlow(k, v, left); ok {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// parseSlow reads a stored slow-down with left ms of TTL.
func parseSlow(key, v string, left int64) (keyed.SlowState, bool) {
	f := strings.Fields(v)
	if len(f) != 3 || f[0] != "1" {
		return keyed.SlowState{}, false
	}
	factor, err := strconv.ParseFloat(f[1], 64)
	ttl, err2 := strconv.ParseInt(f[2], 10, 64)
	if err != nil || err2 != nil || !(factor > 0 && factor < 1) || ttl < left {
		return keyed.SlowState{}, false
	}
	return keyed.SlowState{Key: key, Factor: factor, Age: time.Duration(ttl-left) * time.Millisecond}, true
}

var _ keyed.Leases = (*Claims)(nil)

// In-flight leases (keyed.Leases) are sorted sets of token → deadline
// (Unix ms, Redis TIME): "<prefix>:{<lane>}:inflight" for the lane and
// "<prefix>:{<lane>}:kin:<key>" for each key. A deadline that has passed
// frees its lease; the sets expire with their last one.

// acquireScript takes leases in order, each as alone: KEYS[1] the lane's
// set, KEYS[i] (i ≥ 2) the key set of the (i-1)-th lease; ARGV[1] the lease
// in ms, then per lease its token, keyMax and laneMax. It returns per lease
// 0 (taken, or held by the token already), 1 (key full) or 2 (lane full).
var acquireScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
local added = false
for i = 2, #KEYS do
  local tok = ARGV[3 * i - 4]
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZSCORE', KEYS[i], tok) then
    out[#out + 1] = 0
  elseif redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[3 * i - 3]) then
    out[#out + 1] = 1
  elseif redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3 * i - 2]) then
    out[#out + 1] = 2
  else
    redis.call('ZADD', KEYS[1], now + lease, tok)
    redis.call('ZADD', KEYS[i], now + lease, tok)
    redis.call('PEXPIRE', KEYS[i], lease)
    added = true
    out[#out + 1] = 0
  end
end
if added then redis.call('PEXPIRE', KEYS[1], lease) end
return out
`)

// releaseLeaseScript gives leases back: KEYS[1] the lane's set, KEYS[i]
// (i ≥ 2) the key set of token ARGV[i-1]. It removes each token and the
// lapsed leases of the sets.
var releaseLeaseScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #KEYS do
  redis.call('ZREM', KEYS[1], ARGV[i - 1])
  redis.call('ZREM', KEYS[i], ARGV[i - 1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return 0
`)

// refreshScript: KEYS[1] the lane's set, KEYS[2..] key sets; ARGV[1] the
// lease in ms, ARGV[2..] the tokens (ARGV[i+1] held in KEYS[i]). A lease
// that has lapsed is not taken back (another start may hold it now).
var refreshScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #KEYS do
  local tok = ARGV[i]
  local s = redis.call('ZSCORE', KEYS[i], tok)
  if s and tonumber(s) > now then
    redis.call('ZADD', KEYS[i], 'XX', now + lease, tok)
    redis.call('PEXPIRE', KEYS[i], lease)
  end
  s = redis.call('ZSCORE', KEYS[1], tok)
  if s and tonumber(s) > now then
    redis.call('ZADD', KEYS[1], 'XX', now + lease, tok)
  end
end
if #KEYS > 1 then redis.call('PEXPIRE', KEYS[1], lease) end
return 0
`)

// acquireReq is one lease to take.
type acquireReq struct {
	key, token      string
	laneMax, keyMax int
}

// releaseReq is one lease to give back.
type releaseReq struct{ key, token string }

// acquirer is lane's combiner of lease acquires.
func (c *Claims) acquirer(lane string) *combiner[acquireReq, keyed.Full] {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.acquires[lane]
	if m == nil {
		m = &combiner[acquireReq, keyed.Full]{send: func(ctx context.Context, reqs []acquireReq) ([]keyed.Full, error) {
			return c.acquire(ctx, lane, reqs)
		}}
		c.acquires[lane] = m
	}
	return m
}

// releaser is lane's combiner of lease releases.
func (c *Claims) releaser(lane string) *combiner[releaseReq, struct{}] {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.releases[lane]
	if m == nil {
		m = &combiner[releaseReq, struct{}]{send: func(ctx context.Context, reqs []releaseReq) ([]struct{}, error) {
			return make([]struct{}, len(reqs)), c.release(ctx, lane, reqs)
		}}
		c.releases[lane] = m
	}
	return m
}

// Acquire implements keyed.Leases. Acquires made at the same time on lane
// go to Redis in one script call, taken in order, each as alone.
func (c *Claims) Acquire(ctx context.Context, lane, key, token string, laneMax, keyMax int) (keyed.Full, error) {
	full, err := c.acquirer(lane).do(ctx, acquireReq{key: key, token: token, laneMax: laneMax, keyMax: keyMax})
	if err != nil {
		return keyed.LaneFull, fmt.Errorf("redisclaims: acquire a lease of %s/%s: %w", lane, key, err)
	}
	return full, nil
}

// acquire takes reqs' leases in one script call.
func (c *Claims) acquire(ctx context.Context, lane string, reqs []acquireReq) ([]keyed.Full, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	head := c.head(lane)
	rk := make([]string, 0, len(reqs)+1)
	args := make([]any, 0, 3*len(reqs)+1)
	rk = append(rk, head+"inflight")
	args = append(args, c.cfg.InflightLease.Milliseconds())
	for _, r := range reqs {
		rk = append(rk, head+"kin:"+r.key)
		args = append(args, r.token, r.keyMax, r.laneMax)
	}
	reply, err := acquireScript.Run(ctx, c.c, rk, args...).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(reply) != len(reqs) {
		return nil, fmt.Errorf("%d answers to %d leases", len(reply), len(reqs))
	}
	out := make([]keyed.Full, len(reqs))
	for i, n := range reply {
		switch n {
		case 0:
			out[i] = keyed.Taken
		case 1:
			out[i] = keyed.KeyFull
		case 2:
			out[i] = keyed.LaneFull
		default:
			return nil, fmt.Errorf("answer %d", n)
		}
	}
	return out, nil
}

// ReleaseLease implements keyed.Leases. Releases made at the same time on
// lane go to Redis in one script call.
func (c *Claims) ReleaseLease(ctx context.Context, lane, key, token string) error {
	if _, err := c.releaser(lane).do(ctx, releaseReq{key: key, token: token}); err != nil {
		return fmt.Errorf("redisclaims: release a lease of %s/%s: %w", lane, key, err)
	}
	return nil
}

// release gives reqs' leases back in one script call.
func (c *Claims) release(ctx context.Context, lane string, reqs []releaseReq) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	head := c.head(lane)
	rk := make([]string, 0, len(reqs)+1)
	args := make([]any, 0, len(reqs))
	rk = append(rk, head+"inflight")
	for _, r := range reqs {
		rk = append(rk, head+"kin:"+r.key)
		args = append(args, r.token)
	}
	return releaseLeaseScript.Run(ctx, c.c, rk, args...).Err()
}

// heldScript counts the live leases of KEYS[1].
var heldScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
`)

// Held implements keyed.Leases.
func (c *Claims) Held(ctx context.Context, lane, key string) (int, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	n, err := heldScript.Run(ctx, c.c, []string{c.head(lane) + "kin:" + key}).Int64()
	if err != nil {
		return 0, fmt.Errorf("redisclaims: count leases of %s/%s: %w", lane, key, err)
	}
	return int(n), nil
}

// Refresh implements keyed.Leases.
func (c *Claims) Refresh(ctx context.Context, lane string, held map[string]string) error {
	if len(held) == 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	head := c.head(lane)
	rk := make([]string, 0, len(held)+1)
	args := make([]any, 0, len(held)+1)
	rk = append(rk, head+"inflight")
	args = append(args, c.cfg.InflightLease.Milliseconds())
	for tok, key := range held {
		rk = append(rk, head+"kin:"+key)
		args = append(args, tok)
	}
	if err := refreshScript.Run(ctx, c.c, rk, args...).Err(); err != nil {
		return fmt.Errorf("redisclaims: refresh leases of %s: %w", lane, err)
	}
	return nil
}
