-- Fixed window counter.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate is the limit (requests per window), period the
-- window (µs); cost; burst, flag (but a refund's: its take's, see taken)
-- and id are unused. "take" counts the cost if it fits in the limit;
-- "refund" takes it off the count of the window it was charged in, the
-- take's, while that window lasts, and does nothing once another window
-- has begun: that window's count is other requests'. "charge" counts the
-- cost whatever the window holds (a zone that syncs charges what its
-- instance admitted), up to max_cost, and shows the remaining less than
-- nothing when the count is over the limit (limit - count).
--
-- Windows start at multiples of their length. A counter is stored as one
-- integer, the count followed by the window's tag (see window_tag) in six
-- digits: "<count><tag>", which Redis keeps as a 64-bit integer up to
-- counts of 9 * 10^12. It expires with its window, or, past the limit of
-- a zone that syncs, a window later (see carry_windows): the next window
-- starts at min(c - limit, limit); a count of 0 is no key.
--
-- Reply per key: allowed, remaining, µs until the window ends, µs until
-- the same request could pass, 0.

-- the count of the window tagged tag (what the window before carries into
-- it, at first, when carry), and whether the key holds that window
local function counted(key, tag, limit, carry)
  local c, t = string.match(redis.call('GET', key) or '', '^(%d+)(%d%d%d%d%d%d)$')
  if not c then
    return 0, false
  end
  c, t = tonumber(c), tonumber(t)
  if t == tag then
    return c, true
  end
  if windows_since(t, tag) == 1 and carry_windows(c, limit, carry) == 1 then
    return math.min(c - limit, limit), false
  end
  return 0, false
end

local function decide(key, k)
  local limit, window, cost = k.rate, k.period, k.cost
  local start = now - now % window
  local tag = window_tag(start, window)
  local carry = carries(k)
  local count, charged = counted(key, tag, limit, carry)
  local ok, skip = true, false
  if refund then
    local at = taken(k)
    skip = not charged or at - at % window ~= start
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
  local to_end = start + window - now
  local remaining = limit - count
  if not charge then
    remaining = math.max(remaining, 0)
  end
  return { ok = ok, remaining = remaining, reset = to_end, retry = ok and 0 or to_end,
    tag = tag, count = count, skip = skip, ttl = to_end + window * carry_windows(count, limit, carry) }
end

local function write(key, s)
  if s.skip then
    return
  elseif s.count == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.0f%06d', s.count, s.tag), 'PX', ttl_ms(s.ttl))
  end
end

return run(decide, write)
