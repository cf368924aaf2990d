-- Fixed window counter, all or nothing over every key of one call.
--
-- KEYS, ARGV[1] (time) and ARGV[2] ("take" or "refund") as in
-- token_bucket.lua. ARGV[3 + 6(i-1) ...]: for KEYS[i]: the limit (requests
-- per window), the window (µs), unused, cost, unused, unused.
--
-- Windows start at multiples of their length. A counter is stored as
-- "<window start, µs>:<count>" and expires with its window.
--
-- Returns { now, all allowed, then per key: allowed, remaining, µs until the
-- window ends, µs until the same request could pass, 0 }.

-- now (µs) comes from clock.lua, which is prepended to this script.
local refund = ARGV[2] == 'refund'

local all = true
local state = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local limit, window, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3])
  local start = now - now % window
  local count = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local s, c = string.match(v, '^(%d+):(%d+)$')
    if tonumber(s) == start then
      count = tonumber(c)
    end
  end
  local ok = true
  if refund then
    count = math.max(count - cost, 0)
  else
    ok = count + cost <= limit
    if ok then
      count = count + cost
    end
  end
  all = all and ok
  state[i] = { count = count, ok = ok, limit = limit, start = start, to_end = start + window - now }
end

local out = { now, all and 1 or 0 }
for i = 1, #KEYS do
  local s = state[i]
  if all and ARGV[2] ~= 'peek' then -- a peek writes nothing
    local ms = math.max(math.ceil(s.to_end / 1000), 1)
    redis.call('SET', KEYS[i], string.format('%.0f:%.0f', s.start, s.count), 'PX', ms)
  end
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, math.max(s.limit - s.count, 0))
  table.insert(out, s.to_end)
  table.insert(out, s.ok and 0 or s.to_end)
  table.insert(out, 0)
end
return out
