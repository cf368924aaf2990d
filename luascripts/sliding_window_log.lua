-- Sliding window log.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate is the limit (requests per window), period the
-- window (µs); cost; and id, unique to the request, which names its
-- members (so that a refund removes exactly them); without one, members
-- are named by time and count. burst and flag (but a refund's: its
-- take's, see taken) are unused. "take" adds cost members if they fit in
-- the limit; "refund" removes them again, the request's own: by its id,
-- else those of its take's time.
--
-- A sorted set holds one member per counted request, scored by its time
-- (µs); members that left the window are removed first (but in a peek),
-- so it never holds more than the limit. It expires a window after its
-- newest member.
--
-- Reply per key: allowed, remaining, µs until the oldest counted request
-- leaves the window, µs until the same request could pass, 0.

-- the lowest score (exclusive) still in window: members scored at or
-- before now - window have left it
local function since(window)
  return string.format('(%.0f', now - window)
end

-- the members of key still in window
local function counted(key, window)
  return redis.call('ZCOUNT', key, since(window), '+inf')
end

-- the score of the entry at rank among those still in window
local function score(key, window, rank)
  local e = redis.call('ZRANGE', key, since(window), '+inf', 'BYSCORE', 'LIMIT', rank, 1, 'WITHSCORES')
  return tonumber(e[2])
end

-- refund: removes the request's members (named by its id, else cost of
-- those scored at its take's time, which are alike) and returns the count
-- left. A take adds no more members than the limit, so no more are looked
-- for, whatever the cost. Members that left the window are gone already:
-- nothing of them is given back. (Without an id, other requests of the
-- same µs share the score: sending the request again would remove theirs,
-- so it marks the request dirty.)
local function give_back(key, k)
  if k.id ~= '' then
    for j = 1, math.min(k.cost, k.rate) do
      redis.call('ZREM', key, k.id .. ':' .. j)
    end
    return counted(key, k.period)
  end
  local at = string.format('%.0f', taken(k))
  local members = redis.call('ZRANGE', key, at, at, 'BYSCORE', 'LIMIT', 0, math.min(k.cost, k.rate))
  for _, m in ipairs(members) do
    redis.call('ZREM', key, m)
    dirty = true
  end
  return counted(key, k.period)
end

local function decide(key, k)
  local limit, window, cost = k.rate, k.period, k.cost
  if not peek then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - window))
  end
  local ok, retry, count = true, 0, 0
  if refund then
    count = give_back(key, k)
  else
    count = counted(key, window)
    ok = cost <= limit - count
    if not ok then
      if cost > limit or count == 0 then
        retry = window
      else
        retry = score(key, window, count + cost - limit - 1) + window - now
      end
    end
  end
  -- the oldest counted request, before this one is added
  local oldest = now
  if count > 0 then
    oldest = score(key, window, 0)
  end
  -- what the decision shows: the count with this request, if it passes
  local shown, reset = count, 0
  if ok and not refund then
    shown = count + cost
  end
  if shown > 0 then
    reset = oldest + window - now
  end
  return { ok = ok, remaining = math.max(limit - shown, 0), reset = reset, retry = retry,
    count = count, cost = cost, window = window, id = k.id }
end

local function write(key, s)
  if refund then
    return
  end
  for j = 1, s.cost do
    local member = s.id .. ':' .. j
    if s.id == '' then
      member = string.format('%.0f:%d', now, s.count + j)
    end
    redis.call('ZADD', key, now, member)
  end
  redis.call('PEXPIRE', key, ttl_ms(s.window))
end

return run(decide, write)
