-- Prepended to every algorithm's script: now, in microseconds, is ARGV[1]
-- when the caller gives a time (tests), else the Redis server's clock, so
-- that gateways whose clocks disagree agree on every bucket.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

