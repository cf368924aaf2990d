-- Sliding window counter, all or nothing over every key of one call.
--
-- KEYS, ARGV[1] (time) and ARGV[2] ("take" or "refund") as in
-- token_bucket.lua. ARGV[3 + 6(i-1) ...]: for KEYS[i]: the limit (requests
-- per window), the window (µs), unused, cost, unused, unused.
--
-- Two counters: this window's and the previous one's, which counts for
-- the part of it still inside the sliding window. Stored as
-- "<window start, µs>:<count>:<previous count>", expiring when both have
-- faded out.
--
-- Returns { now, all allowed, then per key: allowed, remaining, µs until
-- both counters have faded out, µs until the same request could pass, 0 }.

-- now (µs) comes from clock.lua, which is prepended to this script.
local refund = ARGV[2] == 'refund'
local eps = 1e-9

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

local all = true
local state = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local limit, window, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3])
  local start = now - now % window
  local curr, prev = 0, 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local s, c, p = string.match(v, '^(%d+):(%d+):(%d+)$')
    s, c, p = tonumber(s), tonumber(c), tonumber(p)
    if s == start then
      curr, prev = c, p
    elseif s == start - window then
      prev = c
    end
  end
  local weight = 1 - (now - start) / window
  local ok = true
  local retry = 0
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
  all = all and ok
  local reset = start + window
  if curr > 0 then
    reset = reset + window
  end
  state[i] = { ok = ok, start = start, curr = curr, prev = prev, reset = reset - now, retry = retry,
    remaining = math.max(math.floor(limit - prev * weight - curr + eps), 0) }
end

local out = { now, all and 1 or 0 }
for i = 1, #KEYS do
  local s = state[i]
  if all and ARGV[2] ~= 'peek' then -- a peek writes nothing
    local ms = math.max(math.ceil(s.reset / 1000), 1)
    redis.call('SET', KEYS[i], string.format('%.0f:%.0f:%.0f', s.start, s.curr, s.prev), 'PX', ms)
  end
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, s.remaining)
  table.insert(out, s.reset)
  table.insert(out, s.retry)
  table.insert(out, 0)
end
return out
