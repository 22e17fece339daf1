package redisbucket

import "github.com/redis/go-redis/v9"

// The scripts share one prelude and one state format.
//
// State: the value of KEYS[1] is tat, the theoretical arrival time, written as
// microseconds since the Unix epoch with exactly three decimals, e.g.
// "1767323045123456.789". Integer microseconds since the epoch are exact in a
// Lua number (a double, exact up to 2^53 ≈ 285 years of µs), and so is every
// nanosecond difference up to 2^53 ns (104 days), so the scripts compute in
// whole nanoseconds relative to now, exactly as the pure functions of package
// bucket do with time.Duration. A single double of fractional µs since the
// epoch would be rounded to 0.25 µs on every write, downward as often as
// upward: at high rates such drift would make a lane faster than its limit.
//
// Arguments, the same for every script:
//
//	KEYS[1]  the state key
//	ARGV[1]  now in the state format ("µs.nnn"), or "" to read Redis TIME
//	ARGV[2]  period T in ns (bucket.Limit.Period)
//	ARGV[3]  tolerance τ in ns (bucket.Limit.Tolerance)
//	ARGV[4]  the operation's argument (n slots, or a pause in ns)
//	ARGV[5]  extra TTL in ms (0 unless a test injects its own clock)
//	ARGV[6]  the caller's floor: the latest tat it has seen for the key, in
//	         the state format, or "" (see "Lost state" below)
//	ARGV[7]  what other live instances may hold, in ns: the slots of the key
//	         they may have reserved and not started, times the period ("0"
//	         for none; see "Lost state" below)
//
// Every script replies with an array whose last two elements are the tat
// after the call in the state format ("" when the bucket is full) and a
// restored flag (1 when the script restored a lost state from the floor).
// Numbers leave a script as strings ("%.0f"): a Lua number returned as such
// is truncated to an integer reply and would overflow silently.
//
// Lost state: a key that expired had its tat at or before now (its TTL is at
// least tat − now), so a missing key is normally a full bucket. When Redis
// loses its data instead (a restart without persistence, a failover to a
// replica that lagged, FLUSHALL), a missing key may hide a bucket that is
// empty, or a pause a downstream asked for, and a fresh burst would break the
// lane's limit; a replica that lagged may hold an older tat instead. Each
// instance remembers the latest tat it saw per key and sends it as the
// floor. A tat never moves back while it is ahead of now, so a key that is
// missing, or older than a floor still ahead of now, lost writes: the script restores it with tat = max(floor, now + τ +
// T) + held, an empty bucket (after admissions alone tat is never beyond
// now + τ + T), and writes it back so that instances with older floors see
// it too. held (ARGV[7]) covers the slots other instances reserved after the
// caller last saw the state: every slot at or after floor − τ was reserved
// from a tat at or past the floor, by an instance that has not started it
// yet, so the lost tat was at most max(floor, now + τ) + held (plus a
// period), and the restored state hands out no slot that an instance still
// holds. The cost is capacity once: held periods nobody uses when the other
// instances held less.
const prelude = `
local function parse(v)
  local us, ns = string.match(v, '^(%-?%d+)%.(%d%d%d)$')
  if not us then return nil end
  return tonumber(us), tonumber(ns)
end

local now_us, now_ns
if ARGV[1] == '' then
  -- TIME before a write needs effects replication on Redis < 5; it is the
  -- only mode (and this call a no-op) from Redis 7 on.
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now_us, now_ns = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
else
  now_us, now_ns = parse(ARGV[1])
  if not now_us then
    return redis.error_reply('ERR redisbucket: bad now argument ' .. ARGV[1])
  end
end

local period = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local arg = tonumber(ARGV[4])
local extra_ttl = tonumber(ARGV[5])

-- ahead reads v, a tat in the state format, as tat - now in ns; nil when v
-- is not in the format.
local function ahead(v)
  local us, ns = parse(v)
  if not us then return nil end
  return (us - now_us) * 1000 + (ns - now_ns)
end

-- lost applies the caller's floor ARGV[i] ("" for none; name is what the
-- error calls it) to a state read as cur (false when the key is missing)
-- and rel (its tat - now in ns) of a limit with tolerance tol and period
-- per. A tat never moves back while it is ahead: a key missing, or behind
-- a floor still ahead, lost writes. It then returns the state to restore,
-- an empty bucket at or past the floor (ns from now, before anything held
-- is added), else nil; or nil and an error for a floor not in the format.
-- The lane's floor and the pair script's key floor both go through it.
local function lost(i, name, cur, rel, tol, per)
  local v = ARGV[i]
  if v == '' then return nil end
  local f = ahead(v)
  if not f then
    return nil, 'ERR redisbucket: bad ' .. name .. ' argument ARGV[' .. i .. '] "' .. v .. '", want µs.nnn'
  end
  if f > 0 and (not cur or rel < f) then
    return math.max(f, tol + per)
  end
  return nil
end

-- rel is tat - now in ns; a missing key is a full bucket (tat <= now),
-- unless the caller's floor says the state was lost (see above).
local rel = 0
local restored = 0
local cur = redis.call('GET', KEYS[1])
if cur then
  rel = ahead(cur)
  if not rel then
    return redis.error_reply('ERR redisbucket: unreadable state ' .. KEYS[1])
  end
end
do
  local r, err = lost(6, 'floor', cur, rel, tau, period)
  if err then return redis.error_reply(err) end
  if r then
    rel = r + (tonumber(ARGV[7]) or 0)
    restored = 1
  end
end

-- state formats now + r (ns) in the state format; it remembers its last
-- answer, since a script formats the tat it stores again for its reply.
local last_r, last_state
local function state(r)
  if r == last_r then return last_state end
  local x = now_ns + r
  local frac = math.fmod(x, 1000)
  if frac < 0 then frac = frac + 1000 end
  local us = now_us + (x - frac) / 1000
  last_r, last_state = r, string.format('%.0f.%03d', us, frac)
  return last_state
end

-- store writes tat = now + r (ns) to key (KEYS[1] unless given) with a TTL
-- of at least the time until the bucket is full again, so an expired key
-- never hands out a burst early.
local function store(r, key)
  key = key or KEYS[1]
  if r <= 0 then
    -- The bucket is full: the state equals no state.
    redis.call('DEL', key)
    return
  end
  -- A whole number of ms up to 1e15 converts to its plain digits (%.17g).
  local ttl = math.ceil(r / 1000000) + extra_ttl
  if ttl > 1e15 then ttl = 1e15 end
  redis.call('SET', key, state(r), 'PX', ttl)
end

if restored == 1 then
  store(rel)
end

local function num(x)
  return string.format('%.0f', x)
end

-- tail is the common end of every reply: the tat for the caller's floor
-- ("" when the bucket is full) and the restored flag.
local function tail(r)
  if r <= 0 then return '', restored end
  return state(r), restored
end
`

// admitScript takes one token if the bucket has one (bucket.Admit). It
// returns {1, tat' - now, tat', restored} when allowed, {0, tat - now, tat,
// restored} when not (ns).
var admitScript = redis.NewScript(prelude + `
if rel < 0 then rel = 0 end
if rel - tau > 0 then
  return {0, num(rel), tail(rel)}
end
rel = rel + period
store(rel)
return {1, num(rel), tail(rel)}
`)

// reserveScript reserves ARGV[4] slots (bucket.Reserve). It returns
// {max(tat, now) - now, tat', restored}: the base the slots are counted from
// (ns), and the state after the reservation.
var reserveScript = redis.NewScript(prelude + `
if rel < 0 then rel = 0 end
local after = rel + arg * period
store(after)
return {num(rel), tail(after)}
`)

// peekScript reads the state without changing it (bucket.Peek), unless it
// restores a lost one. It returns {max(tat, now) - now, tat, restored}.
var peekScript = redis.NewScript(prelude + peekBody + "return {" + peekReply + "}\n")

// peekBody and peekReply are the peek after the prelude: peekScript's and
// the folded one's (PeekLua) are made of them, so they cannot drift apart.
const (
	peekBody  = "\nif rel < 0 then rel = 0 end\n"
	peekReply = "num(rel), tail(rel)"
)

// pauseScript raises tat to at least now + ARGV[4] + τ (bucket.Pause). It
// returns {tat' - now, tat', restored}.
var pauseScript = redis.NewScript(prelude + `
local p = arg + tau
if rel < p then
  rel = p
  store(rel)
end
return {num(rel), tail(rel)}
`)
