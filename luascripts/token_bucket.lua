-- Token bucket, as GCRA.
--
-- KEYS, ARGV and the reply as in common.lua, the state as in gcra.lua,
-- both prepended to this script. For KEYS[i]: rate, period (µs), burst,
-- cost; flag (but a refund's: its take's) and id are unused. "take"
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

local function decide(key, k)
  local g = gcra(key, k, true)
  local cost, wait, ok = k.cost, g.wait, true
  if not refund and not charge then -- in debt, the wait is beyond full
    ok = cost <= k.burst and wait + cost * g.interval <= g.room
    if ok then
      wait = wait + cost * g.interval
    end
  end
  local s = round_tat(g, wait)
  s.ok, s.reset, s.retry = ok, micros(s.wait), 0
  s.remaining = math.max(math.floor((g.room - s.wait) / g.interval), 0)
  if not ok and cost > k.burst then -- never passes: wait for a full bucket
    s.retry = math.max(s.reset, math.ceil(g.interval))
  elseif not ok then -- until cost tokens are in the bucket
    s.retry = micros(s.wait + cost * g.interval - g.full)
  end
  return s
end

return run(decide, write_time)
