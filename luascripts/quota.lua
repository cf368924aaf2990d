-- Calendar quota: a count per period of a calendar (a day, week, month or
-- year in a time zone), each period starting afresh.
--
-- KEYS, ARGV and the reply as in common.lua, and what a global zone's key
-- keeps as in regional.lua, both prepended to this script. For KEYS[i]:
-- rate is the quota (requests per period); cost; flag is a refund's take
-- (see taken); id is "[<tag>/]<b0>:<b1>:<b2>:<b3>", the periods around
-- the caller's clock in µs: the previous period is [b0, b1), the
-- caller's [b1, b2), the next [b2, b3). The caller computes them from its
-- calendar, so that the script knows no time zone; the script takes, on
-- the server's clock, the one of the three that holds now, and fails
-- when none does (see period). The tag is a global zone's (see regionally
-- and charge_once). period and burst are unused. "take" counts the cost
-- if it fits in the quota; "refund" takes it off the count of the period
-- the take was counted in, while that period lasts; "charge" counts it
-- whatever the count, up to max_cost.
--
-- A counter is a string, "<count>:<start>[:<own>]", the period's start in
-- µs, then, for a global zone, what of the count its region admitted: a
-- count of another period is none. It expires at its period's end (a
-- global zone's, at the later of that and its own record's life: 10
-- minutes after its last request or peer's charge); a count of 0 with
-- nothing regional to keep is no key.
--
-- Reply per key: allowed, remaining, µs until the period ends, µs until
-- the same request could pass (the period's end; a global zone's share
-- spent while the world's count has room: sooner, see regionally), the
-- period's count with this cost (used: it may exceed a quota lowered
-- since).

-- the periods of k, parsed once per argument table, with its tag (k.tag,
-- '' for none) and, for a charge of a global zone, the end of the period
-- it counts in (k.stop; see charge_once)
local function periods(k)
  if not k.b then
    local tag, ps = string.match(k.id, '^(.*)/([^/]*)$')
    local b0, b1, b2, b3 = string.match(ps or k.id, '^(%d+):(%d+):(%d+):(%d+)$')
    if not b0 then
      error('quota without its periods (id "' .. k.id .. '", want "[<tag>/]<b0>:<b1>:<b2>:<b3>")')
    end
    k.b, k.tag = { tonumber(b0), tonumber(b1), tonumber(b2), tonumber(b3) }, tag or ''
    local once, stop = string.match(k.tag, '^(.*)@(%d+)$')
    if once then
      k.tag, k.stop = once, tonumber(stop)
    end
  end
  return k.b
end

-- the start and end of the period of b that holds t; nil when none does
local function period(b, t)
  if t < b[1] or t >= b[4] then
    return nil
  elseif t < b[2] then
    return b[1], b[2]
  elseif t < b[3] then
    return b[2], b[3]
  end
  return b[3], b[4]
end

-- the count of key in the period that starts at start, what of it this
-- region admitted (a global zone's), and whether the key holds a count of
-- that period; the records and own record that follow are read (see
-- regional.lua): a record of another period counts no recent admissions
local function counts(key, start)
  local v = redis.call('GET', key) or ''
  local c, s, mine, rest = string.match(v, '^(%d+):(%d+):?(%d*)(.*)$')
  if not c or not read_rest(key, rest) then
    records[key], own[key] = nil, nil
    return 0, 0, false
  elseif tonumber(s) ~= start then
    if own[key] then
      own[key].n = { 0, 0, 0, 0, 0 }
    end
    return 0, 0, false
  end
  return tonumber(c), tonumber(mine) or 0, true
end

-- A global zone's take (limiter/regions) is tagged "G<R>:<D>" or
-- "A<R>:<D>" (see regional). Its key keeps, beside the count of the
-- world's admissions (the region's own, and what the others charged),
-- what of it the region admitted (own) and the region's own record.
-- Alone ("A"), a region admits within its share of the quota, ⌈quota /
-- R⌉, of the period, and within the quota's count. With every region
-- ("G"), it admits within the quota's count, and, unless it holds the
-- whole quota (see holds), what it admitted that the peers may not have
-- been charged yet (recent) stays within its share of what the others
-- left: ⌈(quota − (count − recent)) / R⌉. So the regions together spend
-- unseen at most what the period had left, and a share for each other
-- region that starts asking while one holds (see Bound in
-- limiter/regions). regionally decides k, with count and own the key's,
-- and returns whether it passes, what is left after it, and, refused,
-- when to ask again (µs; nil: at the period's end).
local function regionally(key, k, kind, regions, d, count, mine)
  local o, limit, cost = own_of(key), k.rate, k.cost
  resumed(o, d)
  local left, wait = limit - count, nil
  if kind == 'A' then
    left = math.min(left, math.ceil(limit / regions) - mine)
    if cost <= limit - count then -- the share spent, not the quota: until the links may count others
      wait = d
    end
  elseif not holds(o, d) then
    local r = recent(o, d)
    left = math.min(left, math.ceil((limit - (count - r)) / regions) - r)
    if cost <= limit - count then -- until the quarter of d turns
      local q = d / quarters
      wait = (math.floor(now / q) + 1) * q - now
    end
  end
  local ok = cost <= left
  if ok then
    counted(o, d, cost)
    left = left - cost
  end
  asked(o)
  own[key] = o
  return ok, math.max(left, 0), not ok and wait or nil
end

-- charge_once counts a peer region's charge of a global zone (its tag
-- "n:…" or "o:…", sent once: see charged_once) into count, and lifts
-- count to its level: when it is of the period that ends at stop (the
-- period its admissions counted in, "@<end>" after the tag), else it is
-- nothing (that period's count went with it). It returns the count and
-- whether it counted.
local function charge_once(key, k, count, stop)
  if k.stop and k.stop ~= stop then
    return count, false
  end
  count = math.min(count + charged_once(key, k.tag, k.cost), max_cost)
  if once_tag then
    if once_level then
      count = math.max(count, math.min(once_level, max_cost))
    end
    local o = own_of(key)
    o.peer, own[key] = now, o
  end
  return count, true
end

local function decide(key, k)
  local b = periods(k)
  local limit, cost = k.rate, k.cost
  local start, stop = period(b, now)
  if not start then -- the caller's clock is more than a period off this server's: a count in
    -- another period than the other callers' would start theirs afresh (its on_store_error decides)
    error(string.format('quota: the time %.0f is out of the periods %.0f to %.0f the caller gave: ' ..
      'its clock is more than a period off the Redis server\'s', now, b[1], b[4]))
  end
  local count, mine, charged = counts(key, start)
  local s = { prior = count, prior_mine = mine, start = start, stop = stop, ok = true, skip = false }
  local left, wait = nil, nil
  if refund then
    local at = taken(k)
    s.skip = not charged or period(b, at) ~= start
    if not s.skip then
      count, mine = math.max(count - cost, 0), math.max(mine - cost, 0)
    end
  elseif charge then
    local counted_
    count, counted_ = charge_once(key, k, count, stop)
    s.skip = not counted_
  else
    local kind, regions, d = regional(k.tag)
    if kind then
      s.ok, left, wait = regionally(key, k, kind, regions, d, count, mine)
      s.own = own[key]
    else
      s.ok = cost <= limit - count
    end
    if s.ok then
      count, mine = count + cost, kind and mine + cost or mine
    end
  end
  local to_end = stop - now
  s.count, s.mine, s.used, s.reset = count, mine, count, to_end
  s.remaining = left or math.max(limit - count, 0)
  s.retry = s.ok and 0 or math.ceil(wait or to_end)
  return s
end

-- writes the state s of key: its count, and what it keeps of a global
-- zone's (see counts)
local function write(key, s)
  if s.skip then
    return
  end
  local o, mine, life = s.own or own[key], '', 0
  if o then
    mine, life = own_record(o, s.stop)
  end
  local rest = (records[key] or '') .. mine
  if s.count == 0 and rest == '' then
    redis.call('DEL', key)
    return
  end
  local own_count = s.mine > 0 and string.format(':%.0f', s.mine) or ''
  redis.call('SET', key, string.format('%.0f:%.0f', s.count, s.start) .. own_count .. rest, 'PX',
    ttl_ms(math.max(s.reset, life)))
end

-- touch stores what a refused request of a global zone recorded of its
-- region (its own record), leaving the counts as they were
local function touch(key, s)
  s.count, s.mine = s.prior, s.prior_mine
  write(key, s)
end

return run(decide, write, touch)
