// Package redisquota keeps the caller quotas of package quota in Redis, so
// that every throttler instance sharing one Redis enforces the same limits:
// one Lua script checks both layers of a request (the per-IP sliding window
// and the caller's token bucket) in one round trip, atomically, on Redis
// TIME.
//
// State: the IP layer is a string "<prefix>:{callers}:ip:<ip>" holding
// "<window index>:<its count>:<the previous window's count>", expiring two
// windows after its last write; the caller layer is
// a string "<prefix>:{callers}:c:<caller>" holding the bucket's theoretical
// arrival time in whole microseconds since the epoch (rounded up, so that
// rounding only ever slows a caller down), expiring once the bucket is full
// again. Every key carries the hash tag {callers}: in Redis Cluster all
// caller state lives on one slot, so that one script can touch both layers
// (the state is a few dozen bytes per active caller).
//
// With Config.Lanes set (a single Redis or Sentinel, never Redis Cluster),
// a request that names a lane (quota.Request.Lane) is checked by a second
// script that also peeks the lane's GCRA state (redisbucket.PeekLua), on
// the same now: the caller check and the lane's admission decision are then
// one script run, one round trip, and one MGET of the three keys. The peek
// takes nothing, so the layers' decisions and writes are exactly those of
// the script without it.
//
// Errors other than an invalid request wrap bucket.ErrUnavailable, so that
// quota.Failover answers from memory while Redis is away.
package redisquota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
)

var (
	_ redis.Scripter = (*redis.Client)(nil)
	_ redis.Scripter = (*redis.ClusterClient)(nil)
	_ redis.Scripter = (*redis.AutoPipeliner)(nil)
	_ quota.Limiter  = (*Store)(nil)
)

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 500 * time.Millisecond

// Config configures a Store; zero fields take defaults.
type Config struct {
	// Prefix starts every key; "thr" when empty. No '{' or '}'.
	Prefix string
	// Timeout bounds a call without a deadline; zero: DefaultTimeout.
	Timeout time.Duration
	// Clock, for tests only, replaces Redis TIME with its Now (keys then
	// expire a minute late, since Redis expires them by its own clock). A
	// check folded with a lane's peek (Lanes) takes the lane store's clock
	// instead: set both to the same one.
	Clock clock.Clock
	// Lanes, when set, is the lane store that Request.Lane is peeked in,
	// in the same script as the layers (one round trip for the caller
	// check and the lane's decision). It must share this store's server:
	// leave it nil on a Redis Cluster client, whose lanes live on other
	// slots than the {callers} keys (Result.LaneChecked then stays false).
	Lanes Lanes
	// Logger hears of a folded lane peek whose answer could not be read;
	// nil: slog.Default().
	Logger *slog.Logger
}

// Lanes folds a peek of a lane into the store's script; *redisbucket.Store
// has it.
type Lanes interface {
	Fold(k bucket.Key, l bucket.Limit) (redisbucket.FoldedPeek, error)
}

var _ Lanes = (*redisbucket.Store)(nil)

// Validate reports a configuration error.
func (c Config) Validate() error {
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("redisquota: config: prefix %q: must not contain '{' or '}'", c.Prefix)
	}
	return nil
}

// Store is the Redis quota.Limiter. Safe for concurrent use by any number
// of goroutines and instances.
type Store struct {
	client  redis.Scripter
	head    string
	timeout time.Duration
	clock   clock.Clock // nil: Redis TIME
	extraMs int64
	lanes   Lanes
	log     *slog.Logger
}

// New returns a store over client (a *redis.Client, *redis.ClusterClient
// or *redis.AutoPipeliner); it sends nothing yet.
func New(client redis.Scripter, cfg Config) *Store {
	if cfg.Prefix == "" {
		cfg.Prefix = "thr"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{client: client, head: cfg.Prefix + ":{callers}:", timeout: cfg.Timeout, clock: cfg.Clock, lanes: cfg.Lanes, log: cfg.Logger}
	if cfg.Clock != nil {
		s.extraMs = time.Minute.Milliseconds()
	}
	return s
}

// callersLua checks both layers: callers(now, ipKey, callerKey, o, v)
// decides on v, the values of both keys ({ip, caller}, false when
// missing), and reads its arguments from ARGV[o+1] on (o is 1 in script, 7
// in foldedScript, after the lane's peek):
//
//	ARGV[o+1]  IP limit (0: skip the layer)   ARGV[o+2] window length in µs
//	ARGV[o+3]  1 when the IP layer is observed (the caller layer is checked
//	           even when it refuses)
//	ARGV[o+4]  period T in ns (0: skip the caller layer)
//	ARGV[o+5]  tolerance τ in ns              ARGV[o+6] cost n in tokens
//	ARGV[o+7]  extra TTL in ms (tests with an injected clock)
//
// It returns ip, cur, prev, elapsed µs, plan, tat − now in ns, where ip
// and plan are 1 allowed, 0 refused, -1 not checked. tat − now leaves as a
// string: a Lua number that large could exceed an integer reply (the others
// are bounded by the window's limit and length). A layer that
// allows writes its state once (SET … PX, the expiry folded in); a refusal
// writes nothing, except for a bucket clamped to a stricter plan (see
// quota.clampTAT), as does a read (cost 0) that clamps.
const callersLua = `
local function callers(now, kip, kc, o, v)
  local extra = tonumber(ARGV[o+7])
  local ip, cur, prev, elapsed = -1, 0, 0, 0
  local limit = tonumber(ARGV[o+1])
  if limit > 0 then
    local win = tonumber(ARGV[o+2])
    local idx = math.floor(now / win)
    elapsed = now - idx * win
    if v[1] then
      local si, c, p = string.match(v[1], '^(%d+):(%d+):(%d+)$')
      si = tonumber(si)
      if si == idx then
        cur, prev = tonumber(c), tonumber(p)
      elseif si == idx - 1 then
        prev = tonumber(c)
      end
    end
    if prev * (win - elapsed) / win + cur + 1 <= limit then
      ip = 1
      redis.call('SET', kip, string.format('%.0f:%.0f:%.0f', idx, cur + 1, prev), 'PX', math.ceil(2 * win / 1000) + extra)
    else
      ip = 0
    end
  end
  local plan, rel = -1, 0
  local period = tonumber(ARGV[o+4])
  if period > 0 and (ip ~= 0 or ARGV[o+3] == '1') then
    local tau = tonumber(ARGV[o+5])
    local n = tonumber(ARGV[o+6])
    local clamped = false
    if v[2] then
      rel = (tonumber(v[2]) - now) * 1000
      if rel < 0 then rel = 0 end
      -- At most an empty bucket of the plan: a plan change holds at once.
      if rel > tau + period then
        rel, clamped = tau + period, true
      end
    end
    local w = clamped and rel or nil
    if rel + (n - 1) * period - tau <= 0 then
      plan = 1
      if n > 0 then w = rel + n * period end
    else
      plan = 0
    end
    if w then
      redis.call('SET', kc, string.format('%.0f', now + math.ceil(w / 1000)), 'PX', math.ceil(w / 1000000) + extra)
    end
  end
  return ip, cur, prev, elapsed, plan, string.format('%.0f', rel)
end
`

// script checks both layers: KEYS[1] the IP window, KEYS[2] the caller's
// bucket; ARGV[1] now in µs, or "" for Redis TIME; ARGV[2..8] callersLua's.
// Reply: {ip, cur, prev, elapsed µs, plan, tat − now in ns}.
var script = redis.NewScript(callersLua + `
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
return {callers(now, KEYS[1], KEYS[2], 1, redis.call('MGET', KEYS[1], KEYS[2]))}
`)

// foldedScript peeks a lane's state (redisbucket.PeekLua: KEYS[1],
// ARGV[1..7]) and checks both layers on the same now (KEYS[2] the IP
// window, KEYS[3] the caller's bucket, ARGV[8..14] callersLua's), in one
// run that reads all three keys with one MGET. Reply: script's six values,
// then the lane's three.
var foldedScript = redis.NewScript(redisbucket.PeekLua + callersLua + `
local ip, cur, prev, elapsed, plan, crel = callers(now_us, KEYS[2], KEYS[3], 7, {pre[2], pre[3]})
return {ip, cur, prev, elapsed, plan, crel, lane_reply()}
`)

// IPKey and CallerKey are the Redis keys of the two layers' states.
func (s *Store) ipKey(ip string) string         { return s.head + "ip:" + ip }
func (s *Store) callerKey(caller string) string { return s.head + "c:" + caller }

// Check implements quota.Limiter.
func (s *Store) Check(ctx context.Context, r quota.Request) (quota.Result, error) {
	if err := r.Validate(); err != nil {
		return quota.Result{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	now := ""
	if s.clock != nil {
		now = strconv.FormatInt(s.clock.Now().UnixMicro(), 10)
	}
	var limit, win int64
	ipKey := s.head + "ip:"
	if r.IP != "" && r.PerIP.On() {
		limit, win, ipKey = r.PerIP.Limit, r.PerIP.Length.Microseconds(), s.ipKey(r.IP)
	}
	var period, tau int64
	cKey := s.head + "c:"
	if r.Caller != "" {
		period, tau, cKey = int64(r.Plan.Period()), int64(r.Plan.Tolerance()), s.callerKey(r.Caller)
	}
	observe := "0"
	if r.ObserveIP {
		observe = "1"
	}
	var lane *redisbucket.FoldedPeek
	if r.Lane.Lane != "" && s.lanes != nil {
		if f, err := s.lanes.Fold(r.Lane, r.LaneLimit); err == nil {
			lane = &f
		}
	}
	var reply []any
	var err error
	if lane == nil {
		reply, err = script.Run(ctx, s.client, []string{ipKey, cKey},
			now, limit, win, observe, period, tau, r.Cost, s.extraMs).Slice()
	} else {
		args := append(lane.Args(), limit, win, observe, period, tau, r.Cost, s.extraMs)
		reply, err = foldedScript.Run(ctx, s.client, []string{lane.Key(), ipKey, cKey}, args...).Slice()
	}
	if err != nil {
		return quota.Result{}, fmt.Errorf("redisquota: check: %w: %w", bucket.ErrUnavailable, err)
	}
	var ld bucket.Decision
	laneChecked := lane != nil
	if lane != nil {
		if len(reply) != 9 {
			return quota.Result{}, fmt.Errorf("redisquota: check: %w: %w: %d elements, want 9", bucket.ErrUnavailable, errReply, len(reply))
		}
		if ld, err = lane.Decision(reply[6:]); err != nil {
			// The script has run: the layers are charged and their answer
			// stands. Failing the check would have the caller (a
			// quota.Failover) charge its fallback too; admission peeks the
			// lane on its own instead.
			s.log.Warn("redisquota: the folded lane peek's answer is unreadable; the lane is peeked apart",
				"lane", r.Lane.Lane, "err", err)
			ld, laneChecked = bucket.Decision{}, false
		}
		reply = reply[:6]
	}
	res, err := parse(reply, r)
	if err != nil {
		return quota.Result{}, fmt.Errorf("redisquota: check: %w: %w", bucket.ErrUnavailable, err)
	}
	res.LaneChecked, res.Lane = laneChecked, ld
	return res, nil
}

var errReply = errors.New("unexpected reply")

// parse turns the script's reply into the layers' decisions: the pure
// functions, fed the state the script saw, shape the answer, and must
// agree with what the script decided.
func parse(reply []any, r quota.Request) (quota.Result, error) {
	if len(reply) != 6 {
		return quota.Result{}, fmt.Errorf("%w: %d elements, want 6", errReply, len(reply))
	}
	var n [6]int64
	for i, v := range reply {
		switch v := v.(type) {
		case int64:
			n[i] = v
		case string:
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return quota.Result{}, fmt.Errorf("%w: element %d %q", errReply, i, v)
			}
			n[i] = int64(f)
		default:
			return quota.Result{}, fmt.Errorf("%w: element %d is %T", errReply, i, v)
		}
	}
	var res quota.Result
	if n[0] >= 0 {
		res.IPChecked = true
		res.IP = quota.Slide(time.Duration(n[3])*time.Microsecond, n[2], n[1], r.PerIP, 1)
		if res.IP.Allowed != (n[0] == 1) {
			return quota.Result{}, fmt.Errorf("%w: the script's IP decision %d disagrees with the model at %v", errReply, n[0], res.IP)
		}
	}
	if n[4] >= 0 {
		res.PlanChecked = true
		ref := time.Unix(1<<32, 0)
		res.Plan, _ = bucket.AdmitN(ref, ref.Add(time.Duration(n[5])), r.Plan, r.Cost)
		if res.Plan.Allowed != (n[4] == 1) {
			return quota.Result{}, fmt.Errorf("%w: the script's plan decision %d disagrees with the model at tat-now %dns", errReply, n[4], n[5])
		}
	}
	return res, nil
}
