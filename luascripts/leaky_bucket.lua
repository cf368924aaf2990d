-- Leaky bucket as nginx's limit_req (GCRA).
--
-- KEYS, ARGV and the reply as in common.lua, the state as in gcra.lua,
-- both prepended to this script. For KEYS[i]: rate, period (µs), burst
-- (requests that may wait), cost, flag (nodelay: "1" or "0"; a refund's:
-- its take's); id is unused. "take" queues the request if there is room;
-- "refund" takes off the queue what of the take's cost has not left it yet
-- (see gcra.lua); "charge" adds it to the queue whatever its length (debt:
-- refused until it has drained).
--
-- The queue stores its TAT: when the requests queued so far have all
-- left. A request that would wait more than burst intervals (the room,
-- with the tolerance), or costs more than burst + 1, is refused; the
-- others wait until their slot (none with nodelay).
--
-- A refund that comes after a later request keeps that request's place:
-- it takes off the queue only what of its own cost is still queued at
-- now, never below now. Once the queue has drained since the take,
-- nothing of it is left to give back.
--
-- Reply per key: allowed, remaining, µs until the queue is empty, µs
-- until the same request could pass, µs to wait.

local function decide(key, k)
  local g = gcra(key, k, false)
  local wait, ok, retry, delay = g.wait, true, 0, 0
  if not refund and not charge then
    ok = wait <= g.room and k.cost <= k.burst + 1
    if ok and k.flag ~= '1' then
      delay = micros(wait)
    end
    if ok then
      wait = wait + k.cost * g.interval
    else
      retry = math.max(micros(wait - g.full), 1)
    end
  end
  local s = round_tat(g, wait)
  s.ok, s.reset, s.retry, s.delay = ok, micros(s.wait), retry, delay
  -- the free places: one at the rate, the rest in the queue
  s.remaining = math.max(math.floor((g.room - s.wait) / g.interval) + 1, 0)
  return s
end

return run(decide, write_time)
