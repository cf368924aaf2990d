-- Leaky bucket as nginx's limit_req (GCRA).
--
-- KEYS, ARGV and the reply as in common.lua, the state as in gcra.lua,
-- both prepended to this script. For KEYS[i]: rate, period (µs), burst
-- (requests that may wait), cost, flag (nodelay: "1" or "0"); id is
-- unused. "take" queues the request if there is room; "refund" takes its
-- cost off the queue, at the time the take's reply gave; "charge" adds it
-- to the queue whatever its length (debt: refused until it has drained).
--
-- The queue stores its TAT: when the requests queued so far have all
-- left. A request that would wait more than burst intervals (the room,
-- with the tolerance), or costs more than burst + 1, is refused; the
-- others wait until their slot (none with nodelay).
--
-- A refund that comes after a later request keeps that request's place:
-- it takes only its own cost off the queue's end, never below its own
-- time. When the queue had drained between the charge and the later
-- request, the later one queued from its own time, and the refund may
-- take off up to that gap: at most what leaves during the refund's round
-- trip.
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
  local s = settle(g, wait)
  s.ok, s.reset, s.retry, s.delay = ok, micros(s.wait), retry, delay
  -- the free places: one at the rate, the rest in the queue
  s.remaining = math.max(math.floor((g.room - s.wait) / g.interval) + 1, 0)
  return s
end

return run(decide, write_time)
