-- Prepended, after common.lua, to the scripts of the algorithms a global
-- zone may have (the token bucket, through gcra.lua, and the quota): what
-- a key of a global zone keeps beside its state, and reads (see package
-- limiter/regions).
--
-- A key's value is its state (the algorithm's), then, each starting with
-- "|", the records of the charges the peer regions sent once (see
-- charged_once) and the region's own record (see own). read_rest reads
-- them from what follows the state; a rest of another shape is none.

-- records holds, by key, what follows the state in the key's value: the
-- records of the charges sent once (see charged_once), kept by every
-- write of the key
local records = {}

-- own holds, by key, a global zone's region's own record (see regional
-- in token_bucket.lua), "|L:<tat>:<first>:<last>:<peer>:<win>:<n1>:…:<n5>"
-- in the key's value (no sender's name is upper case), kept by every
-- write of the key: its own TAT (a token bucket's; 0 for a quota), when
-- its region first and last asked for the key, the last charge of a peer
-- region (µs; 0 for none), and its admissions in the quarter of D win and
-- the four before it (n[1] win's). A record of two counts (the window win
-- of D and the one before) is read as the last two quarters of that
-- window: later than they were, so counted no shorter.
local own = {}

-- the quarters of D a region's own record counts its admissions in
local quarters = 4

-- how long a key's own record is kept after its last request or peer's
-- charge, in µs: a client that comes back within it is known
local remember = 600 * 1000000

-- read_rest reads rest, what follows key's state in its value, into
-- records and own; false when it is of another shape (then the whole
-- value is none)
local function read_rest(key, rest)
  records[key], own[key] = nil, nil
  if rest == '' or not rest then
    return true
  elseif not string.match(rest, '^|[%w:|]*$') then
    return false
  end
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
  return true
end

-- the own record of key (a new one when it has none)
local function own_of(key)
  return own[key] or { tat = 0, first = 0, last = 0, peer = 0, win = 0, n = { 0, 0, 0, 0, 0 } }
end

-- the own record o as stored, and how long it is kept (µs; '', 0 when it
-- tells nothing any more): remember after its last request or peer's
-- charge, and at least until until (µs, a time; nil: no such floor)
local function own_record(o, until_)
  local life = math.max(o.tat, o.last > 0 and o.last + remember or 0, o.peer > 0 and o.peer + remember or 0) - now
  if until_ and (o.last > 0 or o.peer > 0) then
    life = math.max(life, until_ - now)
  end
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
-- it ran. The key's value keeps, after its state, each sender's latest
-- "|<sender>:<epoch>:<total>" (at most max_records, the latest), and a
-- charge charges what its total adds to its sender's record: nothing for
-- a send that ran already, or a late copy (a lower total, an earlier
-- epoch). The records go with the key: a bucket that refilled is deleted
-- with them, and a send again then charges its whole total.
local max_records = 8

-- Such a charge may end in ":<level>": how far the sender's region found
-- the key spent when it last refused it (a token bucket's: the time it
-- was empty, in µs from the call, see token_bucket.lua; a quota's: its
-- count). The key is lifted to it when it holds more: so that the
-- regions' copies of a key, which differ after what one of them was not
-- told (a partition, a rollout, debt), converge to the most spent.

-- charged_once is what the charge id of cost still has to charge key, and
-- records it (any other charge: its cost); once_level is its level, or
-- nil, and once_tag whether it was sent once. An id is parsed once for the
-- keys that share it (an exchange's first sends without a level).
local once_id, once_tag, once_epoch, once_level
local function charged_once(key, id, cost)
  local first = string.byte(id, 1)
  if first ~= 110 and first ~= 111 then -- "n", "o"
    once_id, once_tag, once_level = nil, nil, nil
    return cost
  end
  if id ~= once_id then
    local sender, epoch, level = string.match(id, '^.:(%w+):(%d+):?(%-?%d*)$')
    once_id, once_tag, once_epoch = id, sender and '|' .. sender .. ':', tonumber(epoch)
    once_level = tonumber(level)
  end
  if not once_tag then
    return cost
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
      applied = cost
    end
    rest = string.sub(rest, 1, i - 1) .. (j and string.sub(rest, j) or '')
  elseif rest ~= '' and select(2, string.gsub(rest, '|', '')) >= max_records then
    rest = string.sub(rest, (string.find(rest, '|', 2, true) or #rest + 1)) -- the oldest goes
  end
  if applied >= cost then
    return 0
  end
  records[key] = rest .. once_tag .. string.format('%.0f:%.0f', once_epoch, cost)
  return cost - applied
end

-- A global zone's take or peek has, as its tag (a token bucket's id; a
-- quota's, before its periods), "G<R>:<D>" when its region decides with
-- the whole rate, or "A<R>:<D>" when it decides alone (with its share),
-- among R regions whose charges reach each other within D µs (see
-- limiter/regions). regional is its kind, R and D; nil for any other.
local function regional(tag)
  if refund or charge then
    return nil
  end
  local kind, regions, d = string.match(tag, '^([GA])(%d+):?(%d*)$')
  return kind, tonumber(regions), math.max(tonumber(d) or 0, 1)
end

-- asked records a request of the region in o, its own record: the first
-- and the last
local function asked(o)
  if o.first == 0 then
    o.first = now
  end
  o.last = now
end

-- resumed starts o anew (its first ask now) when its region asks again
-- after more than d without asking, and a peer region has asked for the
-- key (its charges are in o.peer): that peer may come back at the same
-- time, after as long without charging, and would hold too, and each
-- would spend unseen the whole burst (quota) left. So such a region holds
-- only once it has been asking for d, by when a peer that came back with
-- it has charged it. A key no peer asked for while this region kept its
-- record (no other region holds a record of it: each charged the others
-- what it admitted, or refused) keeps its hold across pauses. Called
-- before holds.
local function resumed(o, d)
  if o.last > 0 and o.peer > 0 and now - o.last > d then
    o.first = now
  end
end

-- holds tells whether a region whose own record is o holds the whole
-- burst (a quota: the whole quota), among regions whose charges reach
-- each other within d: it first asked for the key at least d ago (a
-- region that asked at the same time has charged it since), and no peer
-- charged it for 2d
local function holds(o, d)
  return o.first > 0 and now - o.first >= d and (o.peer == 0 or now - o.peer >= 2 * d)
end

-- recent is how many of the region's own admissions of the key o counts
-- in the quarter of d now is in and the four before it: every admission
-- the peers may not have been charged yet (those of the last d), and at
-- most a quarter of d more
local function recent(o, d)
  local ago, sum = math.floor(now * quarters / d) - o.win, 0
  for i = 1, quarters + 1 - math.max(ago, 0) do -- n[i] counts quarter win - i + 1
    sum = sum + o.n[i]
  end
  return sum
end

-- counted adds cost to o's count of the quarter of d now is in
local function counted(o, d, cost)
  local w = math.floor(now * quarters / d)
  local ago, n = w - o.win, {}
  if ago <= 0 then -- a time not after the record's (a skewed clock)
    o.n[1] = o.n[1] + cost
    return
  end
  for i = 1, quarters + 1 do
    n[i] = i > ago and o.n[i - ago] or 0
  end
  n[1], o.n, o.win = n[1] + cost, n, w
end
