-- Prepended, after common.lua, to the token and leaky buckets' scripts:
-- both are GCRA, and keep one time per key. GCRA's theoretical arrival
-- time (TAT) is when the requests charged so far are paid for at the rate:
-- the token bucket is full again, the leaky bucket's queue has drained.
-- Each unit of cost moves it on by one interval (period / rate), from now
-- when it is past. The leaky bucket keeps the TAT; the token bucket keeps
-- the TAT less burst intervals: when it was empty, refilling since (see
-- token_bucket.lua).
--
-- The time is stored as one integer, in ns ("<µs><3 digits of ns>", which
-- Redis keeps as a 64-bit integer: 16 bytes), rounded up, and the key
-- expires at the TAT: a missing key is a TAT in the past (a full bucket, an
-- empty queue), and so is a value of another shape. The scripts count in
-- µs from now, where a double keeps a hundredth of a ns over a day. Rounding
-- up delays the TAT by less than 1 ns per charge; a request may come up to
-- tolerance early, which absorbs that.

-- MaxDebt in Go, in µs: how far beyond the burst a charge may put the TAT
local max_debt = 30 * 24 * 3600 * 1000000

-- the time stored in key, in µs from now, or nil
local function stored_time(key)
  local us, ns = string.match(redis.call('GET', key) or '', '^(%d+)(%d%d%d)$')
  if us then
    return tonumber(us) - now + tonumber(ns) / 1000
  end
end

-- how early a request may come and still pass, in µs: one, the clock's
-- resolution, which absorbs the rounding; at most half an interval, so
-- that no extra request passes
local function tolerance(interval)
  return math.min(1, interval / 2)
end

-- rounds x microseconds up to a whole microsecond (but for a millionth
-- of one, float rounding), as the Go implementation does
local function micros(x)
  if x <= 0 then
    return 0
  end
  return math.ceil(x - 1e-6)
end

-- GCRA's state of KEYS[i] with the arguments k: interval; full, burst
-- intervals (an empty bucket's wait, a full queue's); room, the most a
-- charge may leave the TAT ahead of now (full, plus the tolerance);
-- offset, how far before the TAT the stored time is (full when empty is
-- set: the token bucket's, else 0); and wait, how far the TAT is ahead of
-- now (0 when past). A refund has already taken off the wait what its
-- take's charge still holds back (see below), never back before now. A
-- charge has already added its cost's intervals, whatever the bucket holds:
-- the TAT may go beyond the burst (debt), up to max_debt beyond it.
--
-- Charges queue on the TAT in the order of their takes and drain at the
-- rate, in real time. The charge that ended the TAT at e (the take's
-- reply's reset: see taken) holds back, at now, min(cost intervals, e -
-- now): the part of it that has not drained. That is what a refund takes
-- off. What has drained is no one's to give back: the bucket may have
-- refilled since, up to its cap, and a later request charged it again, so
-- that a refund of it would let that request through for free. The
-- charges after it move up the queue by what the refund takes off.
local function gcra(key, k, empty)
  local interval = k.period / k.rate
  local full = k.burst * interval
  local offset = empty and full or 0
  local t = stored_time(key)
  local wait = t and math.max(t + offset, 0) or 0
  if refund then
    local _, e = taken(k)
    wait = math.max(wait - math.min(k.cost * interval, math.max(e - now, 0)), 0)
  elseif charge then
    wait = math.min(wait + k.cost * interval, full + max_debt)
  end
  return { interval = interval, full = full, room = full + tolerance(interval), offset = offset, wait = wait }
end

-- the state that leaves the TAT wait µs ahead of now: the time to store,
-- in µs from now, rounded up to the ns (but for a hundredth of one: the
-- error of a double counting µs over a day), as whole µs and ns, and the
-- wait that it stands for (0, and nothing to store, when wait is)
local function round_tat(g, wait)
  if wait <= 0 then
    return { wait = 0, ok = false, reset = 0, retry = 0, remaining = 0, delay = 0 }
  end
  local t = wait - g.offset
  local whole = math.floor(t)
  local ns = math.max(math.ceil((t - whole) * 1000 - 1e-2), 0)
  if ns >= 1000 then
    whole, ns = whole + 1, 0
  end
  return { whole = whole, ns = ns, wait = math.max(whole + ns / 1000 + g.offset, 0), ok = false, reset = 0, retry = 0,
    remaining = 0, delay = 0 }
end

-- stores the time of the state s, expiring at the TAT; deletes the key
-- when the TAT is now (a full bucket, an empty queue)
local function write_time(key, s)
  if s.wait <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, string.format('%.0f%03d', now + s.whole, s.ns), 'PX', ttl_ms(s.wait))
end

