-- Token bucket, as GCRA.
--
-- KEYS, ARGV and the reply as in common.lua, the state as in gcra.lua,
-- both prepended to this script. For KEYS[i]: rate, period (µs), burst,
-- cost; flag (but a refund's: its take's) is unused, and so is id but a
-- charge's (see gcra.lua) and a global zone's (see regional). "take"
-- charges the cost if the bucket holds it; "refund" gives back what of the
-- take's charge has not drained yet (see gcra.lua); "charge" charges it
-- whatever the bucket holds: in debt (the TAT beyond burst intervals
-- ahead), requests are refused until it is repaid.
--
-- A charge passes if it leaves the TAT at most burst intervals (the room,
-- with the tolerance) ahead of now. The bucket stores when it was empty
-- (the TAT less burst intervals), and holds min(burst, (now - that) /
-- interval) tokens. That time does not depend on the policy: when a zone's
-- policy changes (a config reload), its tokens carry over, capped at the
-- new burst, and if the rate changes too, so does the time they took to
-- refill.
--
-- A refund that comes after a later request leaves that request's charge
-- alone: it takes off the TAT only what of its own charge has not drained
-- by now, never back before now. Once the bucket has refilled to its cap
-- since the take, nothing of the charge is left: a refund gives back
-- nothing, and never more than the burst.
--
-- Reply per key: allowed, whole tokens remaining, µs until full, µs until
-- the same request could pass, 0.

-- A global zone's take or peek has, as its id, "G<R>:<D>" when its
-- region decides with the whole rate, or "A<R>:<D>" when it decides alone
-- (its policy the region's share of the rate: R times the zone's period),
-- among R regions whose charges reach each other within D µs (see
-- limiter/regions). The key then keeps, beside the world's time, which the
-- regions' charges and levels move, the region's own record (own, in
-- regional.lua).
--
-- Alone, a region decides on its own TAT, at its share's rate: what the
-- others admit is within their shares, and what they still charge it
-- does not count against its own; the world's time moves on by what it
-- admits, at the whole rate's interval, and never stays emptier than the
-- own TAT, so that a region that gets the whole rate back (a link healed)
-- has no burst. With the whole rate, a region decides on the world's time
-- and moves its own TAT on too, never into debt, so that a region cut off
-- starts alone from what it spent.
--
-- With the whole rate, a region decides on the world's time with the
-- whole burst (R shares): see decide_whole. It holds the burst while no
-- other region asks for the key: it has been asking for it for at least
-- D (a region that asked at the same time has charged it since; after a
-- pause, see resumed), and no peer charged the key for 2D; a region
-- alone counts as a peer that charged
-- (it cannot be told), so holds never outlive a partition. Another region
-- that starts asking for the key meanwhile spends its part at once, and
-- the holder stops holding within D: so the regions spend unseen, at
-- most, the room there was, a share for each other region, and the
-- refill (see Bound in limiter/regions).
-- the state of the token bucket g's decision from wait (its TAT, µs from
-- now, of interval g's) of cost, with room (the most a charge may leave
-- the TAT ahead, with the tolerance; g's when nil)
local function decided(g, k, wait, ok, room)
  room = room or g.room
  local s = round_tat(g, wait)
  s.ok, s.reset, s.retry = ok, micros(s.wait), 0
  s.remaining = math.max(math.floor((room - s.wait) / g.interval), 0)
  if not ok and k.cost * g.interval > room then -- never passes: wait for a full bucket
    s.retry = math.max(s.reset, math.ceil(g.interval))
  elseif not ok then -- until cost tokens are in the bucket
    s.retry = micros(s.wait + k.cost * g.interval - (room - tolerance(g.interval)))
  end
  return s
end

-- decide_alone decides k of key, a region's alone among regions (its
-- policy's interval the share's), on the region's own TAT (see regional)
local function decide_alone(key, k, g, regions)
  local o = own_of(key)
  local wait = math.max(o.tat - now, 0)
  local ok = k.cost <= k.burst and wait + k.cost * g.interval <= g.room
  if ok then
    wait = wait + k.cost * g.interval
  end
  local s = decided(g, k, wait, ok)
  local interval = g.interval / regions -- the whole rate's
  -- the world's time, when empty (µs from now), on by cost at the whole
  -- rate from no earlier than full, and spent no less than the own time
  -- is (its wait, in µs, at least the own's: the share's part of the
  -- burst spent is the whole burst's part of it)
  local t = math.max(g.wait - g.offset, -k.burst * interval) + k.cost * interval
  local w = round_tat(g, math.min(math.max(t, s.wait - k.burst * interval) + g.offset, g.full + max_debt))
  w.ok, w.remaining, w.reset, w.retry = s.ok, s.remaining, s.reset, s.retry
  asked(o)
  o.peer, w.own = now, o
  if ok then
    o.tat = math.ceil(now + s.wait)
  end
  return w
end

-- decide_whole decides k of key, of a region with the whole rate among
-- regions whose charges reach each other within d, on the world's time:
-- the bucket, holding the whole burst, must have room for the cost; and,
-- unless the region holds the burst, what it admitted that the peers may
-- not have been charged yet (recent) must stay within its share of the
-- room the others left it and of what refills in 2d. So the regions
-- together never spend, unseen by each other, more than the room there
-- was and the refill (see Bound in limiter/regions). The own TAT moves on
-- at the share's rate, never in debt.
local function decide_whole(key, k, g, regions, d)
  local o, whole, cost = own_of(key), k.burst * regions, k.cost
  resumed(o, d)
  local room = whole * g.interval + tolerance(g.interval)
  local wait = g.wait
  local ok = cost * g.interval <= room and wait + cost * g.interval <= room
  local allow, mine = nil, recent(o, d)
  if not holds(o, d) then
    allow = (whole - wait / g.interval + mine) / regions + 2 * d / (regions * g.interval)
    ok = ok and mine + cost <= allow
  end
  if ok then
    wait = wait + cost * g.interval
    counted(o, d, cost)
  end
  local s = decided(g, k, wait, ok, room)
  if allow then -- what the share of the room still admits
    s.remaining = math.max(math.min(s.remaining, math.floor(allow - recent(o, d))), 0)
    if not ok and s.retry == 0 then -- until the quarter turns
      local q = d / quarters
      s.retry = micros((math.floor(now / q) + 1) * q - now)
    end
  end
  local interval = g.interval * regions
  local mine_tat = math.max(o.tat - now, 0)
  if ok then
    mine_tat = math.min(mine_tat + cost * interval, k.burst * interval)
  end
  o.tat = mine_tat > 0 and math.ceil(now + mine_tat) or 0
  asked(o)
  s.own = o
  return s
end

local function decide(key, k)
  local g = gcra(key, k, true)
  local kind, regions, d = regional(k.id)
  if kind == 'A' then
    return decide_alone(key, k, g, regions)
  elseif kind == 'G' then
    return decide_whole(key, k, g, regions, d)
  end
  local cost, wait, ok = k.cost, g.wait, true
  if not refund and not charge then -- in debt, the wait is beyond full
    ok = cost <= k.burst and wait + cost * g.interval <= g.room
    if ok then
      wait = wait + cost * g.interval
    end
  end
  return decided(g, k, wait, ok)
end

return run(decide, write_time, touch)
