-- Sliding window counter.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate is the limit (requests per window), period the
-- window (µs); cost; burst, flag and id are unused. "take" counts the cost
-- if it fits in the limit; "refund" takes it off the count of the window
-- it was charged in, now's (the caller refunds at the time the take's
-- reply gave): this window's count, or, once another request has moved
-- the key on to the next window, the previous count, in which the charge
-- still weighs; any other state is other requests' and is left alone.
--
-- Two counters: this window's and the previous one's, which counts for
-- the part of it still inside the sliding window. Stored as
-- "<count>:<previous count>:<window tag>" (see window_tag), expiring when
-- both have faded out.
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

-- the stored window's tag and its two counts, or nil
local function stored(key)
  local c, p, t = string.match(redis.call('GET', key) or '', '^(%d+):(%d+):(%d+)$')
  if c then
    return tonumber(t), tonumber(c), tonumber(p)
  end
end

-- the counts of the window that started at start and of the one before
local function counts(key, start, window)
  local t, c, p = stored(key)
  if t == window_tag(start, window) then
    return c, p
  elseif t == window_tag(start - window, window) then
    return 0, c
  end
  return 0, 0
end

-- the state that a window starting at start, with counts curr and prev,
-- stores and shows at now
local function state(limit, window, start, curr, prev)
  local weight = 1 - (now - start) / window
  local reset = start + window
  if curr > 0 then
    reset = reset + window
  end
  return { ok = true, remaining = math.max(math.floor(limit - prev * weight - curr + eps), 0),
    reset = reset - now, tag = window_tag(start, window), curr = curr, prev = prev }
end

-- refund: the cost off the count of the window charged, which started at
-- start: the stored window's, or its previous one's
local function give_back(key, k, start)
  local t, c, p = stored(key)
  if t == window_tag(start, k.period) then
    c = math.max(c - k.cost, 0)
  elseif t == window_tag(start + k.period, k.period) then
    start, p = start + k.period, math.max(p - k.cost, 0)
  else
    return { ok = true, remaining = 0, reset = 0, skip = true }
  end
  return state(k.rate, k.period, start, c, p)
end

local function decide(key, k)
  local limit, window, cost = k.rate, k.period, k.cost
  local start = now - now % window
  if refund then
    return give_back(key, k, start)
  end
  local curr, prev = counts(key, start, window)
  local weight = 1 - (now - start) / window
  local ok = prev * weight + curr + cost <= limit + eps
  if ok then
    curr = curr + cost
  end
  local s = state(limit, window, start, curr, prev)
  if not ok then
    s.ok, s.retry = false, retry_after(start, window, prev, curr, cost, limit)
  end
  return s
end

local function write(key, s)
  if s.skip then
    return
  end
  redis.call('SET', key, string.format('%.0f:%.0f:%d', s.curr, s.prev, s.tag), 'PX', ttl_ms(s.reset))
end

return run(decide, write)
