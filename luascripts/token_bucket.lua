-- Token bucket, all or nothing over every key of one call.
--
-- KEYS: one bucket per key (in a cluster, all in one hash slot).
-- ARGV[1]: the time in microseconds, or "" for the server's clock (TIME).
-- ARGV[2]: "take" charges the costs if every bucket holds them, else none;
--          "refund" gives the costs back (capped at the burst).
-- ARGV[3 + 6(i-1) ...]: for KEYS[i]: rate, period (µs), burst, cost, and
--          two arguments other algorithms use.
--
-- A bucket is stored as "<tokens>:<time of update, µs>" and expires when it
-- is full again, since a missing bucket is a full one.
--
-- Returns integers only: { now, all allowed (1/0), then for each key:
-- allowed (1/0), whole tokens remaining, µs until full, µs until the same
-- request could pass (0 when allowed), µs to wait (always 0 here) }.

-- now (µs) comes from clock.lua, which is prepended to this script.
local refund = ARGV[2] == 'refund'
local eps = 1e-9

-- tokens held by a bucket at now, refilled since its last update
local function held(key, burst, interval)
  local v = redis.call('GET', key)
  if not v then
    return burst
  end
  local tokens, last = string.match(v, '^([^:]+):(%d+)$')
  tokens, last = tonumber(tokens), tonumber(last)
  if not tokens or not last then
    return burst
  end
  return math.min(burst, tokens + math.max(now - last, 0) / interval)
end

local function ceil_time(n, interval)
  if n <= eps then
    return 0
  end
  return math.ceil(n * interval)
end

local all = true
local state = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local rate, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local burst, cost = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local interval = period / rate
  local tokens = held(KEYS[i], burst, interval)
  local ok = true
  if refund then
    tokens = math.min(burst, tokens + cost)
  else
    ok = cost <= burst and tokens + eps >= cost
    if ok then
      tokens = math.max(tokens - cost, 0)
    end
  end
  all = all and ok
  local to_full = ceil_time(burst - tokens, interval)
  local retry = 0
  if not ok then
    if cost > burst then
      retry = math.max(to_full, math.ceil(interval))
    else
      retry = ceil_time(cost - tokens, interval)
    end
  end
  state[i] = { tokens = tokens, ok = ok, to_full = to_full, retry = retry }
end

local out = { now, all and 1 or 0 }
for i = 1, #KEYS do
  local s = state[i]
  if all and ARGV[2] ~= 'peek' then -- a peek writes nothing
    if s.to_full > 0 then
      local ms = math.max(math.ceil(s.to_full / 1000), 1)
      redis.call('SET', KEYS[i], string.format('%.17g:%.0f', s.tokens, now), 'PX', ms)
    else
      redis.call('DEL', KEYS[i])
    end
  end
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, math.floor(s.tokens + eps))
  table.insert(out, s.to_full)
  table.insert(out, s.retry)
  table.insert(out, 0)
end
return out
