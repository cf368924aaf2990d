-- Calendar quota: a count per period of a calendar (a day, week, month or
-- year in a time zone), each period starting afresh.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate is the quota (requests per period); cost;
-- flag is a refund's take (see taken); id is the periods around the
-- caller's clock, "<b0>:<b1>:<b2>:<b3>" in µs: the previous period is
-- [b0, b1), the caller's [b1, b2), the next [b2, b3). The caller computes
-- them from its calendar, so that the script knows no time zone; the
-- script takes, on the server's clock, the one of the three that holds
-- now, and fails when none does (see period). period and burst are unused. "take"
-- counts the cost if it fits in the quota; "refund" takes it off the
-- count of the period the take was counted in, while that period lasts;
-- "charge" counts it whatever the count, up to max_cost.
--
-- A counter is a string, "<count>:<start>", the period's start in µs: a
-- count of another period is none. It expires at its period's end; a
-- count of 0 is no key.
--
-- Reply per key: allowed, remaining, µs until the period ends, µs until
-- the same request could pass (the period's end), the period's count with
-- this cost (used: it may exceed a quota lowered since).

-- the periods of k, parsed once per argument table
local function periods(k)
  if not k.b then
    local b0, b1, b2, b3 = string.match(k.id, '^(%d+):(%d+):(%d+):(%d+)$')
    if not b0 then
      error('quota without its periods (id "' .. k.id .. '", want "<b0>:<b1>:<b2>:<b3>")')
    end
    k.b = { tonumber(b0), tonumber(b1), tonumber(b2), tonumber(b3) }
  end
  return k.b
end

-- the start and end of the period of b that holds t; nil when none does
local function period(b, t)
  if t < b[1] or t >= b[4] then
    return nil
  elseif t < b[2] then
    return b[1], b[2]
  elseif t < b[3] then
    return b[2], b[3]
  end
  return b[3], b[4]
end

local function decide(key, k)
  local b = periods(k)
  local limit, cost = k.rate, k.cost
  local start, stop = period(b, now)
  if not start then -- the caller's clock is more than a period off this server's: a count in
    -- another period than the other callers' would start theirs afresh (its on_store_error decides)
    error(string.format('quota: the time %.0f is out of the periods %.0f to %.0f the caller gave: ' ..
      'its clock is more than a period off the Redis server\'s', now, b[1], b[4]))
  end
  local c, s = string.match(redis.call('GET', key) or '', '^(%d+):(%d+)$')
  local count, charged = 0, false
  if c and tonumber(s) == start then
    count, charged = tonumber(c), true
  end
  local ok, skip = true, false
  if refund then
    local at = taken(k)
    skip = not charged or period(b, at) ~= start
    if not skip then
      count = math.max(count - cost, 0)
    end
  elseif charge then
    count = math.min(count + cost, max_cost)
  else
    ok = cost <= limit - count
    if ok then
      count = count + cost
    end
  end
  local to_end = stop - now
  return { ok = ok, remaining = math.max(limit - count, 0), reset = to_end, retry = ok and 0 or to_end,
    used = count, count = count, start = start, skip = skip }
end

local function write(key, s)
  if s.skip then
    return
  elseif s.count == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.0f:%.0f', s.count, s.start), 'PX', ttl_ms(s.reset))
  end
end

return run(decide, write)
