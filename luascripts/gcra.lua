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

-- times holds, by key, the time as stored (see touch); the records and
-- the own record that follow it are regional.lua's.
local times = {}

-- the time stored in key, in µs from now, or nil
local function stored_time(key)
  local v = redis.call('GET', key) or ''
  local us, ns, rest = string.match(v, '^(%d+)(%d%d%d)(.*)$')
  times[key] = nil
  if not read_rest(key, rest) then -- another shape
    us = nil
  end
  if us then
    times[key] = us .. ns
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
-- the TAT may go beyond the burst (debt), up to max_debt beyond it. A
-- charge whose id is "a<µs>" (a zone that syncs: what an instance
-- admitted, the last of it that long ago) is made as of that time: a
-- bucket that was full then is charged from then, not from now, since
-- it refilled no more after those admissions than the exact bucket
-- would have (the age is the instance's last request: no earlier than
-- the admissions, so the charge is never less than theirs).
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
    local age = string.byte(k.id, 1) == 97 and tonumber(string.sub(k.id, 2)) -- "a<µs>"
    if age then -- as of age µs ago: a bucket full then refilled no more since
      wait = math.max(t and t + offset or -age, -age)
    end
    wait = math.max(math.min(wait + charged_once(key, k.id, k.cost) * interval, full + max_debt), 0)
    if once_tag and once_level then -- lifted to the sender's level
      wait = math.max(wait, math.min(once_level + offset, full + max_debt))
    end
    if once_tag then -- a peer region asked for the key
      local o = own_of(key)
      o.peer, own[key] = now, o
    end
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

-- stores the time of the state s, expiring at the TAT, and the key's own
-- record (s.own when set, else the key's), kept no shorter; deletes the
-- key when neither tells anything (a full bucket, an empty queue)
local function write_time(key, s)
  local o, mine, life = s.own or own[key], '', 0
  if o then
    mine, life = own_record(o)
  end
  if s.wait <= 0 and mine == '' then
    redis.call('DEL', key)
    return
  end
  local t = s.wait > 0 and string.format('%.0f%03d', now + s.whole, s.ns) or '0000' -- '0000': long past
  redis.call('SET', key, t .. (records[key] or '') .. mine, 'PX', ttl_ms(math.max(s.wait, life)))
end

-- touch stores s.own, the own record of a key whose request was refused,
-- leaving its time as it was
local function touch(key, s)
  local mine, life = own_record(s.own)
  if mine == '' then
    return
  end
  local ttl = redis.call('PTTL', key)
  redis.call('SET', key, (times[key] or '0000') .. (records[key] or '') .. mine, 'PX',
    math.max(ttl, ttl_ms(life)))
end
