-- Concurrency limit: requests in flight, as leases, all or nothing over
-- every key of one call.
--
-- KEYS, ARGV[1] (time) as in token_bucket.lua. ARGV[2]: "take" acquires a
-- lease if every key has room; "refund" and "release" give it back.
-- ARGV[3 + 6(i-1) ...]: for KEYS[i]: unused, the lease's lifetime (µs),
-- the most in flight, unused, unused, the lease's id.
--
-- A sorted set holds the leases, scored by when they expire: a Caddy that
-- crashes with requests in flight cannot hold their slots for longer than
-- a lease lives. Expired leases are removed first.
--
-- Returns { now, all allowed, then per key: allowed, slots free, 0, µs
-- until the same request could pass (a guess: 1 s), 0 }.

-- now (µs) comes from clock.lua, which is prepended to this script.
local take = ARGV[2] == 'take'

local all = true
local state = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 6
  local lease, most, id = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 5]
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%.0f', now))
  if not take then
    redis.call('ZREM', KEYS[i], id)
  end
  local count = redis.call('ZCARD', KEYS[i])
  local ok = not take or count + 1 <= most
  all = all and ok
  state[i] = { ok = ok, count = count, most = most, lease = lease, id = id }
end

local out = { now, all and 1 or 0 }
for i = 1, #KEYS do
  local s = state[i]
  local count = s.count
  if take and s.ok then
    count = count + 1
  end
  if take and all then
    redis.call('ZADD', KEYS[i], now + s.lease, s.id)
    redis.call('PEXPIRE', KEYS[i], math.max(math.ceil(s.lease / 1000), 1))
  end
  table.insert(out, s.ok and 1 or 0)
  table.insert(out, math.max(s.most - count, 0))
  table.insert(out, 0)
  table.insert(out, s.ok and 0 or 1000000)
  table.insert(out, 0)
end
return out
