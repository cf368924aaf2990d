-- Sliding window counter.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate is the limit (requests per window), period the
-- window (µs); cost; burst, flag and id are unused. "take" counts the cost
-- if it fits in the limit; "refund" takes it off this window's count.
--
-- Two counters: this window's and the previous one's, which counts for
-- the part of it still inside the sliding window. Stored as
-- "<window start, µs>:<count>:<previous count>", expiring when both have
-- faded out.
--
-- Reply per key: allowed, remaining, µs until both counters have faded
-- out, µs until the same request could pass, 0.

-- how long until prev * weight + curr + cost fits in the limit
local function retry_after(start, window, prev, curr, cost, limit)
  if cost > limit then
    return window
  end
  local room = limit - cost - curr
  if room >= 0 and prev > 0 then
    return math.max(start + math.ceil(window * (1 - room / prev)) - now, 1)
  end
  local nxt = start + window
  if curr > 0 then
    nxt = nxt + math.ceil(window * (1 - (limit - cost) / curr))
  end
  return math.max(nxt - now, 1)
end

-- the counts of the window that started at start and of the one before
local function counts(key, start, window)
  local v = redis.call('GET', key)
  if v then
    local s, c, p = string.match(v, '^(%d+):(%d+):(%d+)$')
    s, c, p = tonumber(s), tonumber(c), tonumber(p)
    if s == start then
      return c, p
    elseif s == start - window then
      return 0, c
    end
  end
  return 0, 0
end

local function decide(key, k)
  local limit, window, cost = k.rate, k.period, k.cost
  local start = now - now % window
  local curr, prev = counts(key, start, window)
  local weight = 1 - (now - start) / window
  local ok, retry = true, 0
  if refund then
    curr = math.max(curr - cost, 0)
  else
    ok = prev * weight + curr + cost <= limit + eps
    if ok then
      curr = curr + cost
    else
      retry = retry_after(start, window, prev, curr, cost, limit)
    end
  end
  local reset = start + window
  if curr > 0 then
    reset = reset + window
  end
  return { ok = ok, remaining = math.max(math.floor(limit - prev * weight - curr + eps), 0),
    reset = reset - now, retry = retry, start = start, curr = curr, prev = prev }
end

local function write(key, s)
  redis.call('SET', key, string.format('%.0f:%.0f:%.0f', s.start, s.curr, s.prev), 'PX', ttl_ms(s.reset))
end

return run(decide, write)
