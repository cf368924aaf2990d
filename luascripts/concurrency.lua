-- Concurrency limit: requests in flight, as leases.
--
-- KEYS, ARGV and the reply as in common.lua, which is prepended to this
-- script. For KEYS[i]: period is the lease's lifetime (µs), burst the most
-- in flight, id the lease's id; rate, cost and flag are unused. "take"
-- acquires a lease if there is room; "refund" and "release" give it back;
-- "renew" extends a lease still held to a full lifetime from now.
--
-- A sorted set holds the leases, scored by when they expire: a Caddy that
-- crashes with requests in flight cannot hold their slots for longer than
-- a lease lives. Expired leases are removed first, in every mode.
--
-- Reply per key: allowed, slots free, 0, µs until the same request could
-- pass (a guess: 1 s), 0.

local take = mode == 'take'
local renew = mode == 'renew'

local function decide(key, k)
  local most = k.burst
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
  if not take and not renew then
    redis.call('ZREM', key, k.id)
  end
  local count = redis.call('ZCARD', key)
  local ok = not take or count + 1 <= most
  if take and ok then
    count = count + 1
  end
  return { ok = ok, remaining = math.max(most - count, 0), reset = 0, retry = ok and 0 or 1000000,
    lease = k.period, id = k.id }
end

local function write(key, s)
  if take or (renew and redis.call('ZSCORE', key, s.id)) then
    redis.call('ZADD', key, now + s.lease, s.id)
    redis.call('PEXPIRE', key, ttl_ms(s.lease))
  end
end

return run(decide, write)
