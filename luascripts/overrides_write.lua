-- Writes one override, or deletes it, and moves the version on.
-- KEYS[1]: the hash of the overrides (entry name -> JSON)
-- KEYS[2]: their version, a counter
-- KEYS[3]: the expiries, a sorted set (entry name, scored by its expiry
--          in Unix ms)
-- ARGV[1]: the entry's name; ARGV[2]: its JSON, '' to delete it;
-- ARGV[3]: its expiry (Unix ms, 0: none); ARGV[4]: now (Unix ms), the
--          writer's clock: entries expired by then are dropped.
-- Returns {found, version}: found is 1 when the entry existed before.
local found = redis.call('HEXISTS', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  if tonumber(ARGV[3]) > 0 then
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  else
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[4], 'LIMIT', 0, 1000)
for _, name in ipairs(gone) do
  redis.call('HDEL', KEYS[1], name)
  redis.call('ZREM', KEYS[3], name)
end
return {found, redis.call('INCR', KEYS[2])}
