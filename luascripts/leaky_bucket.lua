-- Leaky bucket as nginx's limit_req (GCRA).
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: rate, period (µs), burst (requests that may wait),
-- cost, flag (nodelay: "1" or "0"); id is unused. "take" queues the
-- request if there is room; "refund" takes its cost off the queue, at the
-- time the take's reply gave.
--
-- A refund that comes after a later request keeps that request's place:
-- it takes only its own cost off the queue's end, never below its own
-- time. When the queue had drained between the charge and the later
-- request, the later one queued from its own time, and the refund may
-- take off up to that gap: at most what leaves during the refund's round
-- trip.
--
-- The state is the theoretical arrival time (µs, unrounded): when the
-- requests queued so far have all left. A request that would wait more
-- than burst intervals, or costs more than burst + 1, is refused; the
-- others wait until their slot (none with nodelay). Stored as "<tat>",
-- expiring when the queue is empty.
--
-- Reply per key: allowed, remaining, µs until the queue is empty, µs
-- until the same request could pass, µs to wait.

local slack = 0.5 -- absorbs the rounding of float microseconds

-- rounds x microseconds up, as the Go implementation does
local function micros(x)
  if x <= 0 then
    return 0
  end
  return math.ceil(x - 1e-6)
end

local function decide(key, k)
  local burst, cost, nodelay = k.burst, k.cost, k.flag == '1'
  local interval = k.period / k.rate
  local tat = tonumber(redis.call('GET', key) or '') or now
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
  local ahead = (tat - now) / interval
  return { ok = ok, remaining = math.max(math.floor(burst + 1 - ahead + eps), 0), reset = micros(tat - now),
    retry = retry, delay = delay, tat = tat }
end

local function write(key, s)
  if s.tat > now then
    redis.call('SET', key, string.format('%.17g', s.tat), 'PX', ttl_ms(s.tat - now))
  else
    redis.call('DEL', key)
  end
end

return run(decide, write)
