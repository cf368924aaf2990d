-- Bans of repeat offenders, shared by the fleet.
--
-- KEYS[1]: the ban key; KEYS[2]: the denial counter (same hash slot).
-- ARGV[1]: "check" reads the ban; "deny" counts a denial and bans when
-- there are enough; "set" bans for ARGV[4] ms unless the ban in place
-- lasts longer (a ban started in another region). ARGV[2]: denials that
-- ban; ARGV[3]: the window they are counted in (ms); ARGV[4]: how long a
-- ban lasts (ms).
--
-- Returns { the ban's remaining time in ms (0 when not banned), 1 when
-- this call started the ban, else 0 }.

local ttl = redis.call('PTTL', KEYS[1])
if ARGV[1] == 'set' then
  local ms = tonumber(ARGV[4])
  if ms and ms > ttl then
    redis.call('SET', KEYS[1], '1', 'PX', ms)
    ttl = ms
  end
  return { math.max(ttl, 0), 0 }
end
if ttl > 0 then
  return { ttl, 0 }
end
if ARGV[1] ~= 'deny' then
  return { 0, 0 }
end
local n = redis.call('INCR', KEYS[2])
if n == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if n >= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[4])
  redis.call('DEL', KEYS[2])
  return { tonumber(ARGV[4]), 1 }
end
return { 0, 0 }
