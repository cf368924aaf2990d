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

-- records holds, by key, what follows the time in the key's value: the
-- records of the charges sent once (see charged_once), kept by every
-- write of the key
local records = {}

-- own holds, by key, a global zone's region's own record (see regional
-- in token_bucket.lua), "|L:<tat>:<first>:<last>:<peer>:<win>:<n1>:…:<n5>"
-- in the key's value (no sender's name is upper case), kept by every
-- write of the key: its own TAT, when its region first and last asked
-- for the key, the last charge of a peer region (µs; 0 for none), and
-- its admissions in the quarter of D win and the four before it (n[1]
-- win's). A record of two counts (the window win of D and the one
-- before) is read as the last two quarters of that window: later than
-- they were, so counted no shorter.
-- times holds, by key, the time as stored (see touch).
local own, times = {}, {}

-- the quarters of D a region's own record counts its admissions in
local quarters = 4

-- how long a key's own record is kept after its last request or peer's
-- charge, in µs: a client that comes back within it is known
local remember = 600 * 1000000

-- the time stored in key, in µs from now, or nil
local function stored_time(key)
  local v = redis.call('GET', key) or ''
  local us, ns, rest = string.match(v, '^(%d+)(%d%d%d)(.*)$')
  records[key], own[key], times[key] = nil, nil, nil
  if rest ~= '' and rest then
    if string.match(rest, '^|[%w:|]*$') then
      local mine = string.match(rest, '|L:[%d:]+')
      if mine then
        local f = {}
        for n in string.gmatch(mine, '%d+') do
          f[#f + 1] = tonumber(n)
        end
        local o = { tat = f[1] or 0, first = f[2] or 0, last = f[3] or 0, peer = f[4] or 0, win = f[5] or 0, n = {} }
        for i = 1, quarters + 1 do
          o.n[i] = f[5 + i] or 0
        end
        if #f == 7 then -- a window of D and the one before
          o.win = (o.win + 1) * quarters - 1
        end
        own[key] = o
        rest = string.gsub(rest, '|L:[%d:]+', '')
      end
      records[key] = rest ~= '' and rest or nil
    else -- another shape
      us = nil
    end
  end
  if us then
    times[key] = us .. ns
    return tonumber(us) - now + tonumber(ns) / 1000
  end
end

-- the own record of key (a new one when it has none)
local function own_of(key)
  return own[key] or { tat = 0, first = 0, last = 0, peer = 0, win = 0, n = { 0, 0, 0, 0, 0 } }
end

-- the own record o as stored, and how long it is kept (µs; '', 0 when it
-- tells nothing any more)
local function own_record(o)
  local life = math.max(o.tat, o.last > 0 and o.last + remember or 0, o.peer > 0 and o.peer + remember or 0) - now
  if life <= 0 then
    return '', 0
  end
  local n = o.n
  return string.format('|L:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f', o.tat, o.first, o.last, o.peer, o.win,
    n[1], n[2], n[3], n[4], n[5]), life
end

-- A charge sent once, by a region's exchange (see limiter/regions): its
-- id is "n:<sender>:<epoch>", the first send of an epoch, or
-- "o:<sender>:<epoch>", a send again; its cost is the total the sender
-- charged the key in that epoch, sent whole until the sender knows that
-- it ran. The key's value keeps, after its time, each sender's latest
-- "|<sender>:<epoch>:<total>" (at most max_records, the latest), and a
-- charge charges what its total adds to its sender's record: nothing for
-- a send that ran already, or a late copy (a lower total, an earlier
-- epoch). The records go with the key: a bucket that refilled is deleted
-- with them, and a send again then charges its whole total.
local max_records = 8

-- Such a charge may end in ":<level>": how far the sender's region found
-- the bucket spent when it last refused it, as the time it was empty (see
-- token_bucket.lua), in µs from the call (negative: it held tokens then).
-- The bucket is lifted to it when it holds more (see gcra): so that the
-- regions' copies of a bucket, which differ after what one of them was
-- not told (a partition, a rollout, debt), converge to the most spent.

-- charged_once is what k's charge of key still has to charge, and
-- records it (any other charge: its cost); once_level is its level, or
-- nil. An id is parsed once for the keys that share it (an exchange's
-- first sends without a level).
local once_id, once_tag, once_epoch, once_level
local function charged_once(key, k)
  local first = string.byte(k.id, 1)
  if first ~= 110 and first ~= 111 then -- "n", "o"
    once_id, once_tag, once_level = nil, nil, nil
    return k.cost
  end
  if k.id ~= once_id then
    local sender, epoch, level = string.match(k.id, '^.:(%w+):(%d+):?(%-?%d*)$')
    once_id, once_tag, once_epoch = k.id, sender and '|' .. sender .. ':', tonumber(epoch)
    once_level = tonumber(level)
  end
  if not once_tag then
    return k.cost
  end
  local rest, applied = records[key] or '', 0
  local i = string.find(rest, once_tag, 1, true)
  if i then -- this sender's record: "<epoch>:<total>", cut out of rest
    local j = string.find(rest, '|', i + 1, true)
    local e, t = string.match(string.sub(rest, i + #once_tag, (j or 0) - 1), '^(%d+):(%d+)$')
    e = tonumber(e) or 0
    if e == once_epoch then
      applied = tonumber(t) or 0
    elseif e > once_epoch then
      applied = k.cost
    end
    rest = string.sub(rest, 1, i - 1) .. (j and string.sub(rest, j) or '')
  elseif rest ~= '' and select(2, string.gsub(rest, '|', '')) >= max_records then
    rest = string.sub(rest, (string.find(rest, '|', 2, true) or #rest + 1)) -- the oldest goes
  end
  if applied >= k.cost then
    return 0
  end
  records[key] = rest .. once_tag .. string.format('%.0f:%.0f', once_epoch, k.cost)
  return k.cost - applied
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
    wait = math.max(math.min(wait + charged_once(key, k) * interval, full + max_debt), 0)
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
