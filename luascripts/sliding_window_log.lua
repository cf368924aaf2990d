-- Sliding window log, all or nothing over every key of one call.
--
-- KEYS, ARGV[1] (time) and ARGV[2] ("take" or "refund") as in
-- token_bucket.lua. ARGV[3 + 6(i-1) ...]: for KEYS[i]: the limit (requests
-- per window), the window (µs), unused, cost, unused, and an id unique to
-- the request, which names its members (so that a refund removes exactly
-- them); without one, members are named by time and count.
--
-- A sorted set holds one member per counted request, scored by its time
-- (µs); members that left the window are removed first, so it never holds
-- more than the limit. It expires a window after its newest member.
--
-- Returns { now, all allowed, then per key: allowed, remaining, µs until
-- the oldest counted request leaves the window, µs until the same request
-- could pass, 0 }.

-- now (µs) comes from clock.lua, which is prepended to this script.
local refund = ARGV[2] == 'refund'

-- the window of the key at hand (scores at or before now - window have left)
local window_of_call = 0

-- the score of the entry at rank among those still in the window
local function score(key, rank)
  local e = redis.call('ZRANGE', key, '(' .. string.format('%.0f', now - window_of_call), '+inf', 'BYSCORE', 'LIMIT', rank, 1, 'WITHSCORES')
  return tonumber(e[2])
end

local all = true
local state = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local limit, window, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3])
  window_of_call = window
  local id = ARGV[a + 5]
  if ARGV[2] ~= 'peek' then -- a peek writes nothing
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%.0f', now - window))
  end
  local ok = true
  local retry = 0
  if refund and id ~= '' then
    for j = 1, cost do
      redis.call('ZREM', KEYS[i], id .. ':' .. j)
    end
  end
  local count = redis.call('ZCOUNT', KEYS[i], string.format('(%.0f', now - window), '+inf')
  if refund then
    if id == '' and count > 0 then
      redis.call('ZREMRANGEBYRANK', KEYS[i], -math.min(cost, count), -1)
      count = math.max(count - cost, 0)
    end
  else
    ok = count + cost <= limit
    if not ok then
      if cost > limit or count == 0 then
        retry = window
      else
        retry = score(KEYS[i], count + cost - limit - 1) + window - now
      end
    end
  end
  all = all and ok
  state[i] = { count = count, ok = ok, limit = limit, window = window, cost = cost, retry = retry, id = id }
end

local out = { now, all and 1 or 0 }
for i = 1, #KEYS do
  local s = state[i]
  -- the oldest counted request, before this one is added
  local oldest = now
  if s.count > 0 then
    oldest = score(KEYS[i], 0)
  end
  window_of_call = s.window
  if all and not refund and ARGV[2] ~= 'peek' then
    for j = 1, s.cost do
      local member = s.id .. ':' .. j
      if s.id == '' then
        member = string.format('%.0f:%d', now, s.count + j)
      end
      redis.call('ZADD', KEYS[i], now, member)
    end
    redis.call('PEXPIRE', KEYS[i], math.max(math.ceil(s.window / 1000), 1))
  end
  -- what the decision shows: the count with this request, if it passes
  local count = s.count
  if s.ok and not refund then
    count = count + s.cost
  end
  local reset = 0
  if count > 0 then
    reset = oldest + s.window - now
  end
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, math.max(s.limit - count, 0))
  table.insert(out, reset)
  table.insert(out, s.retry)
  table.insert(out, 0)
end
return out
