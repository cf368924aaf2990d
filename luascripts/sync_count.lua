-- Counts the instances that sync: the members of the sorted set KEYS[1]
-- scored within ARGV[2] ms of Redis's time, ARGV[1] (the instance asking)
-- counted once whether it is or not. It registers nothing.
local t = redis.call('TIME')
local since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[2])
local n = redis.call('ZCOUNT', KEYS[1], since, '+inf')
local mine = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '-1')
if mine < since then
  n = n + 1
end
return n
