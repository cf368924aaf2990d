-- Leaky bucket as nginx's limit_req (GCRA), all or nothing over every key
-- of one call.
--
-- KEYS, ARGV[1] (time) and ARGV[2] ("take" or "refund") as in
-- token_bucket.lua. ARGV[3 + 6(i-1) ...]: for KEYS[i]: rate, period (µs),
-- burst (requests that may wait), cost, nodelay (1 or 0), unused.
--
-- The state is the theoretical arrival time (µs, unrounded): when the
-- requests queued so far have all left. A request that would wait more
-- than burst intervals, or costs more than burst + 1, is refused; the
-- others wait until their slot (none with nodelay). Stored as "<tat>",
-- expiring when the queue is empty.
--
-- Returns { now, all allowed, then per key: allowed, remaining, µs until
-- the queue is empty, µs until the same request could pass, µs to wait }.

-- now (µs) comes from clock.lua, which is prepended to this script.
local refund = ARGV[2] == 'refund'
local eps = 1e-9
local slack = 0.5 -- absorbs the rounding of float microseconds

-- rounds x microseconds up, as the Go implementation does
local function micros(x)
  if x <= 0 then
    return 0
  end
  return math.ceil(x - 1e-6)
end

local all = true
local state = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local rate, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local burst, cost, nodelay = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4] == '1'
  local interval = period / rate
  local tat = tonumber(redis.call('GET', KEYS[i]) or '') or now
  tat = math.max(tat, now)
  local wait = tat - now
  local max_wait = burst * interval
  local ok, retry, delay = true, 0, 0
  if refund then
    tat = math.max(tat - cost * interval, now)
  else
    ok = wait <= max_wait + slack and cost <= burst + 1
    if ok then
      tat = tat + cost * interval
      if not nodelay then
        delay = micros(wait)
      end
    else
      retry = math.max(micros(wait - max_wait), 1)
    end
  end
  all = all and ok
  local ahead = (tat - now) / interval
  state[i] = { ok = ok, tat = tat, retry = retry, delay = delay,
    remaining = math.max(math.floor(burst + 1 - ahead + eps), 0) }
end

local out = { now, all and 1 or 0 }
for i = 1, #KEYS do
  local s = state[i]
  if all and ARGV[2] ~= 'peek' then -- a peek writes nothing
    if s.tat > now then
      redis.call('SET', KEYS[i], string.format('%.17g', s.tat), 'PX', math.max(math.ceil((s.tat - now) / 1000), 1))
    else
      redis.call('DEL', KEYS[i])
    end
  end
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, s.remaining)
  table.insert(out, micros(s.tat - now))
  table.insert(out, s.retry)
  table.insert(out, s.delay)
end
return out
