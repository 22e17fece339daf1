// Package redisquota keeps the caller quotas of package quota in Redis, so
// that every throttler instance sharing one Redis enforces the same limits:
// one Lua script checks both layers of a request (the per-IP sliding window
// and the caller's token bucket) in one round trip, atomically, on Redis
// TIME.
//
// State: the IP layer is a string "<prefix>:{callers}:ipw:<ip>" holding
// the window's index, its count and the previous window's count as three
// little-endian doubles (24 bytes, Lua's struct.pack('<ddd')), expiring
// two windows after its last write; the caller layer is
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
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	ipHead  string // "<prefix>:{callers}:ipw:"
	cHead   string // "<prefix>:{callers}:c:"
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
	head := cfg.Prefix + ":{callers}:"
	s := &Store{client: client, ipHead: head + "ipw:", cHead: head + "c:", timeout: cfg.Timeout, clock: cfg.Clock, lanes: cfg.Lanes, log: cfg.Logger}
	if cfg.Clock != nil {
		s.extraMs = time.Minute.Milliseconds()
	}
	return s
}

// callersLua checks both layers. It is a block, not a function (a
// closure made on every run costs Redis more than the call saves), run
// after the code before it set the locals
//
//	now  whole µs since the epoch
//	kip  the IP window's key   vip  its value (false when missing)
//	kc   the caller's key      vc   its value (false when missing)
//	p    the packed parameters (packParams: seven little-endian doubles,
//	     read by one struct.unpack)
//
// and declared the results ip, cur, prev, elapsed, plan, crel (not rel:
// PeekLua has a rel of its own). The parameters are
//
//	limit   IP limit (0: skip the layer)   win  window length in µs
//	observe 1 when the IP layer is observed (the caller layer is checked
//	        even when it refuses)
//	period  T in ns (0: skip the caller layer)
//	tau     τ in ns                        n    cost in tokens
//	extra   extra TTL in ms (tests with an injected clock)
//
// The results are ip, cur, prev, elapsed µs, plan, crel = tat − now in
// ns, where ip and plan are 1 allowed, 0 refused, -1 not checked: all of
// them whole numbers that leave as integer replies (tat − now is at most τ + T, under
// 2^63 ns for every valid plan: bucket.Limit.Validate bounds burst·period
// by 100 days). A layer that allows writes its state once (SET … PX, the
// expiry folded in); a refusal writes nothing, except for a bucket clamped
// to a stricter plan (see quota.clampTAT), as does a read (cost 0) that
// clamps.
//
// The block does no string work of its own (string.match, string.format
// and tonumber are what a short script spends its time on inside Redis):
// the IP window is 24 bytes struct.pack('<ddd', index, count, previous
// count), the caller's tat an integer that Redis formats as it writes it
// (a Lua number argument becomes its %.17g digits) and tonumber reads.
// A window value of any other length (an old or foreign one) counts as no
// state.
const callersLua = `
ip, cur, prev, elapsed, plan, crel = -1, 0, 0, 0, -1, 0
do
  local limit, win, observe, period, tau, n, extra = struct.unpack('<ddddddd', p)
  if limit > 0 then
    local idx = math.floor(now / win)
    elapsed = now - idx * win
    if vip and #vip == 24 then
      local si, c, pr = struct.unpack('<ddd', vip)
      if si == idx then
        cur, prev = c, pr
      elseif si == idx - 1 then
        prev = c
      end
    end
    if prev * (win - elapsed) / win + cur + 1 <= limit then
      ip = 1
      redis.call('SET', kip, struct.pack('<ddd', idx, cur + 1, prev), 'PX', math.ceil(2 * win / 1000) + extra)
    else
      ip = 0
    end
  end
  if period > 0 and (ip ~= 0 or observe == 1) then
    local clamped = false
    if vc then
      crel = (tonumber(vc) - now) * 1000
      if crel < 0 then crel = 0 end
      -- At most an empty bucket of the plan: a plan change holds at once.
      if crel > tau + period then
        crel, clamped = tau + period, true
      end
    end
    local w = clamped and crel or nil
    if crel + (n - 1) * period - tau <= 0 then
      plan = 1
      if n > 0 then w = crel + n * period end
    else
      plan = 0
    end
    if w then
      redis.call('SET', kc, now + math.ceil(w / 1000), 'PX', math.ceil(w / 1000000) + extra)
    end
  end
end
`

// script checks both layers: KEYS[1] the IP window, KEYS[2] the caller's
// bucket; ARGV[1] now in µs, or "" for Redis TIME; ARGV[2] callersLua's
// packed parameters. Reply: {ip, cur, prev, elapsed µs, plan, tat − now in
// ns}.
var script = redis.NewScript(`
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[1])
end
local v = redis.call('MGET', KEYS[1], KEYS[2])
local kip, kc, p, vip, vc = KEYS[1], KEYS[2], ARGV[2], v[1], v[2]
local ip, cur, prev, elapsed, plan, crel
` + callersLua + `
return {ip, cur, prev, elapsed, plan, crel}
`)

// foldedScript peeks a lane's state (redisbucket.PeekLua: KEYS[1],
// ARGV[1..7]) and checks both layers on the same now (KEYS[2] the IP
// window, KEYS[3] the caller's bucket, ARGV[8] callersLua's packed
// parameters), in one run that reads all three keys with one MGET. Reply:
// script's six values, then the lane's three.
var foldedScript = redis.NewScript(redisbucket.PeekLua + `
local now, kip, kc, p, vip, vc = now_us, KEYS[2], KEYS[3], ARGV[8], pre[2], pre[3]
local ip, cur, prev, elapsed, plan, crel
` + callersLua + `
return {ip, cur, prev, elapsed, plan, crel, lane_reply()}
`)

// paramsLen is the length of callersLua's packed parameters.
const paramsLen = 7 * 8

// packParams packs callersLua's parameters as seven little-endian
// doubles: one argument that the script reads with one struct.unpack,
// instead of seven decimal strings and seven tonumber calls. Every value
// is a whole number below 2^53 (or a period and τ that tonumber rounded to
// the same double before), so the script sees what it saw as decimals.
func packParams(limit, win int64, observe bool, period, tau int64, n int, extra int64) []byte {
	b := make([]byte, paramsLen)
	obs := int64(0)
	if observe {
		obs = 1
	}
	for i, v := range [7]int64{limit, win, obs, period, tau, int64(n), extra} {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(float64(v)))
	}
	return b
}

// ipKey and callerKey are the Redis keys of the two layers' states. The
// IP window's key says "ipw:" since its value became binary: the text
// windows of older versions ("ip:", "<index>:<count>:<previous count>")
// are never read, and expire two windows after their last request.
func (s *Store) ipKey(ip string) string         { return s.ipHead + ip }
func (s *Store) callerKey(caller string) string { return s.cHead + caller }

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
	ipKey := s.ipHead
	if r.IP != "" && r.PerIP.On() {
		limit, win, ipKey = r.PerIP.Limit, r.PerIP.Length.Microseconds(), s.ipKey(r.IP)
	}
	var period, tau int64
	cKey := s.cHead
	if r.Caller != "" {
		period, tau, cKey = int64(r.Plan.Period()), int64(r.Plan.Tolerance()), s.callerKey(r.Caller)
	}
	params := packParams(limit, win, r.ObserveIP, period, tau, r.Cost, s.extraMs)
	var lane *redisbucket.FoldedPeek
	if r.Lane.Lane != "" && s.lanes != nil {
		if f, err := s.lanes.Fold(r.Lane, r.LaneLimit); err == nil {
			lane = &f
		}
	}
	var reply []any
	var err error
	if lane == nil {
		reply, err = script.Run(ctx, s.client, []string{ipKey, cKey}, now, params).Slice()
	} else {
		reply, err = foldedScript.Run(ctx, s.client, []string{lane.Key(), ipKey, cKey}, lane.Args(params)...).Slice()
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
