-- Writes back the overrides an instance holds, when Redis lost them, once:
-- only when the version is still the one the instance read (absent, or
-- older than the one it holds); the other instances then find a version
-- moved on, and read what was written.
-- KEYS[1]: the hash of the overrides (entry name -> JSON)
-- KEYS[2]: their version, "<n>:<nonce>"
-- KEYS[3]: the expiries, a sorted set (entry name, scored by its expiry
--          in Unix ms)
-- ARGV[1]: the version read ('' for none); ARGV[2]: the number of the
-- version held; ARGV[3]: the new version's nonce; ARGV[4]: 0: no
-- announcement, 1: PUBLISH, 2: PUBLISH and SPUBLISH; ARGV[5]: the channel;
-- ARGV[6...]: the overrides, as entry name, JSON, expiry (Unix ms, 0:
-- none).
-- The hash and the expiries are replaced; entries expired by Redis's clock
-- are left out. The new version's number is beyond both the one read and
-- the one held. The change is announced as "<previous version, or ->
-- <new version>", without names: every instance reads the whole hash.
-- Returns {1, new version, entries written}, or {0, the version found}
-- when it is not the one read (another instance wrote first).
local cur = redis.call('GET', KEYS[2]) or ''
if cur ~= ARGV[1] then
  return {0, cur}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[1], KEYS[3])
local written = 0
for i = 6, #ARGV - 2, 3 do
  local expires = tonumber(ARGV[i + 2]) or 0
  if expires == 0 or expires > now then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    if expires > 0 then
      redis.call('ZADD', KEYS[3], expires, ARGV[i])
    end
    written = written + 1
  end
end
local had = tonumber(string.match(cur, '^(%d+)')) or 0
local held = tonumber(ARGV[2]) or 0
local next = string.format('%.0f', math.max(had, held) + 1) .. ':' .. ARGV[3]
redis.call('SET', KEYS[2], next)
if ARGV[4] ~= '0' then
  local p = cur
  if p == '' then p = '-' end
  redis.pcall('PUBLISH', ARGV[5], p .. ' ' .. next)
  if ARGV[4] == '2' then redis.pcall('SPUBLISH', ARGV[5], p .. ' ' .. next) end
end
return {1, next, written}
