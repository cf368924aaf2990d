-- Sliding window counter.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate is the limit (requests per window), period the
-- window (µs); cost; burst, flag (but a refund's: its take's, see taken)
-- and id are unused. "take" counts the cost if it fits in the limit;
-- "refund" takes it off the count of the window it was charged in, the
-- take's: the stored window's count, or, once another request has moved
-- the key on to the next window, the previous count, in which the charge
-- still weighs; any other state is other requests' and is left alone.
-- "charge" counts the cost in this window whatever the counts hold (a
-- zone that syncs charges what its instance admitted), up to max_cost,
-- and shows the remaining less than nothing when the weighted count is
-- over the limit.
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

-- the counts of the window that started at start and of the one before.
-- When the window turns, the count becomes the previous one; for a zone
-- that syncs (carry), at most the limit, and what went over it is carried
-- into the new window's count (see carry_windows).
local function counts(key, start, window, limit, carry)
  local t, c, p = stored(key)
  if not t then
    return 0, 0
  end
  local k = windows_since(t, window_tag(start, window))
  local over = carry_windows(c, limit, carry) == 1
  if k == 0 then
    return c, p
  elseif k == 1 and over then
    return math.min(c - limit, limit), limit
  elseif k == 1 then
    return 0, c
  elseif k == 2 and over then -- the carried count, never stored, is the previous one
    return 0, math.min(c - limit, limit)
  end
  return 0, 0
end

-- the state that a window starting at start, with counts curr and prev,
-- stores and shows at now
local function state(limit, window, start, curr, prev, carry)
  local weight = 1 - (now - start) / window
  local reset = start + window
  if curr > 0 then
    reset = reset + window
  end
  return { ok = true, remaining = math.max(math.floor(limit - prev * weight - curr + eps), 0),
    reset = reset - now, tag = window_tag(start, window), curr = curr, prev = prev,
    ttl = reset - now + window * carry_windows(curr, limit, carry) }
end

-- refund: the cost off the count of the take's window: the stored
-- window's count, or its previous count when the key has moved on one
-- window since the take; any other state is other requests'. The state
-- shown is now's, whose window starts at start (the stored window is now's
-- or the one before; or the one after, for a refund made at its take's
-- time after a later request moved the key on). The stored window keeps
-- its tag, and expires when its counts have faded.
local function give_back(key, k, start)
  local window, at = k.period, taken(k)
  local from = at - at % window
  local t, c, p = stored(key)
  local s -- the stored window's start
  if t == window_tag(from, window) then
    s, c = from, math.max(c - k.cost, 0)
  elseif t == window_tag(from + window, window) then
    s, p = from + window, math.max(p - k.cost, 0)
  else
    local curr, prev = counts(key, start, window, k.rate)
    local st = state(k.rate, window, start, curr, prev)
    st.skip = true
    return st
  end
  local st
  if s == start then
    st = state(k.rate, window, start, c, p)
  elseif s == start - window then -- the stored count is now's previous one
    st = state(k.rate, window, start, 0, c)
  elseif s < start then -- faded
    st = state(k.rate, window, start, 0, 0)
  else
    st = state(k.rate, window, s, c, p)
  end
  st.tag, st.curr, st.prev = window_tag(s, window), c, p
  st.ttl = s + window - now -- until both counts have faded
  if c > 0 then
    st.ttl = st.ttl + window
  end
  return st
end

local function decide(key, k)
  local limit, window, cost = k.rate, k.period, k.cost
  local start = now - now % window
  if refund then
    return give_back(key, k, start)
  end
  local carry = carries(k)
  local curr, prev = counts(key, start, window, limit, carry)
  if charge then
    local s = state(limit, window, start, math.min(curr + cost, max_cost), prev, carry)
    s.remaining = math.floor(limit - prev * (1 - (now - start) / window) - s.curr + eps)
    return s
  end
  local weight = 1 - (now - start) / window
  local ok = prev * weight + curr + cost <= limit + eps
  if ok then
    curr = curr + cost
  end
  local s = state(limit, window, start, curr, prev, carry)
  if not ok then
    s.ok, s.retry = false, retry_after(start, window, prev, curr, cost, limit)
  end
  return s
end

local function write(key, s)
  if s.skip then
    return
  end
  local ttl = s.ttl or s.reset
  if ttl <= 0 then -- a refund left counts that have faded
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, string.format('%.0f:%.0f:%d', s.curr, s.prev, s.tag), 'PX', ttl_ms(ttl))
end

return run(decide, write)
