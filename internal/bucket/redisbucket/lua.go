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
//
// Numbers leave a script as strings ("%.0f"): a Lua number returned as such
// is truncated to an integer reply and would overflow silently.
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

-- rel is tat - now in ns; a missing key is a full bucket (tat <= now).
local rel = 0
local cur = redis.call('GET', KEYS[1])
if cur then
  local us, ns = parse(cur)
  if not us then
    return redis.error_reply('ERR redisbucket: unreadable state ' .. KEYS[1])
  end
  rel = (us - now_us) * 1000 + (ns - now_ns)
end

-- store writes tat = now + r (ns) with a TTL of at least the time until the
-- bucket is full again, so an expired key never hands out a burst early.
local function store(r)
  if r <= 0 then
    -- The bucket is full: the state equals no state.
    redis.call('DEL', KEYS[1])
    return
  end
  local x = now_ns + r
  local frac = math.fmod(x, 1000)
  if frac < 0 then frac = frac + 1000 end
  local us = now_us + (x - frac) / 1000
  local ttl = math.ceil(r / 1000000) + extra_ttl
  if ttl > 1e15 then ttl = 1e15 end
  redis.call('SET', KEYS[1], string.format('%.0f.%03d', us, frac),
    'PX', string.format('%.0f', ttl))
end

local function num(x)
  return string.format('%.0f', x)
end
`

// admitScript takes one token if the bucket has one (bucket.Admit). It
// returns {1, tat' - now} when allowed, {0, tat - now} when not (ns).
var admitScript = redis.NewScript(prelude + `
if rel < 0 then rel = 0 end
if rel - tau > 0 then
  return {0, num(rel)}
end
rel = rel + period
store(rel)
return {1, num(rel)}
`)

// reserveScript reserves ARGV[4] slots (bucket.Reserve). It returns
// max(tat, now) - now in ns, the base the slots are counted from.
var reserveScript = redis.NewScript(prelude + `
if rel < 0 then rel = 0 end
store(rel + arg * period)
return num(rel)
`)

// peekScript reads the state without changing it (bucket.Peek). It returns
// max(tat, now) - now in ns.
var peekScript = redis.NewScript(prelude + `
if rel < 0 then rel = 0 end
return num(rel)
`)

// pauseScript raises tat to at least now + ARGV[4] + τ (bucket.Pause). It
// returns the resulting tat - now in ns.
var pauseScript = redis.NewScript(prelude + `
local p = arg + tau
if rel < p then
  rel = p
  store(rel)
end
return num(rel)
`)
