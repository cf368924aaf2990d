-- Token bucket.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate, period (µs), burst, cost; flag and id are
-- unused. "take" charges the cost if the bucket holds it; "refund" gives
-- it back (capped at the burst), at the time the take's reply gave.
--
-- A refund that comes after a later request leaves that request's charge
-- alone: the tokens are kept as of the later update (never moved back to
-- the refund's time, which would refill them twice), plus the cost. It
-- may give back up to what the bucket refilled between the charge and the
-- later request, when that refill met the burst's cap (the refund cannot
-- tell): at most the refill of the refund's round trip, and never more
-- than the burst.
--
-- A bucket is stored as "<tokens>:<time of update, µs>" and expires when it
-- is full again, since a missing bucket is a full one.
--
-- Reply per key: allowed, whole tokens remaining, µs until full, µs until
-- the same request could pass, 0.

-- tokens held by a bucket at now, refilled since its last update, and
-- the later of now and that update
local function held(key, burst, interval)
  local v = redis.call('GET', key)
  if not v then
    return burst, now
  end
  local tokens, last = string.match(v, '^([^:]+):(%d+)$')
  tokens, last = tonumber(tokens), tonumber(last)
  if not tokens or not last then
    return burst, now
  end
  return math.min(burst, tokens + math.max(now - last, 0) / interval), math.max(now, last)
end

-- the time n tokens take to refill, µs rounded up
local function ceil_time(n, interval)
  if n <= eps then
    return 0
  end
  return math.ceil(n * interval)
end

local function decide(key, k)
  local interval = k.period / k.rate
  local tokens, at = held(key, k.burst, interval)
  local ok = true
  if refund then
    tokens = math.min(k.burst, tokens + k.cost)
  else
    ok = k.cost <= k.burst and tokens + eps >= k.cost
    if ok then
      tokens = math.max(tokens - k.cost, 0)
    end
  end
  local to_full = ceil_time(k.burst - tokens, interval)
  local retry = 0
  if not ok then
    if k.cost > k.burst then
      retry = math.max(to_full, math.ceil(interval))
    else
      retry = ceil_time(k.cost - tokens, interval)
    end
  end
  return { ok = ok, remaining = math.floor(tokens + eps), reset = to_full, retry = retry, tokens = tokens,
    at = refund and at or now }
end

local function write(key, s)
  if s.reset > 0 then
    redis.call('SET', key, string.format('%.17g:%.0f', s.tokens, s.at), 'PX', ttl_ms(s.at - now + s.reset))
  else
    redis.call('DEL', key)
  end
end

return run(decide, write)
