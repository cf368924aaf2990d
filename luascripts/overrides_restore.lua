-- Writes back, entry by entry, the changes an instance holds that Redis
-- lacks: each entry is written when Redis holds none of it, or an earlier
-- change (by their stamps, as overrides_write.lua orders them), and it has
-- not expired by Redis's clock. Any number of instances may run it at
-- once: the later change of each entry stays.
-- KEYS[1]: the hash of the overrides (entry name -> JSON)
-- KEYS[2]: their version, "<n>:<nonce>"
-- KEYS[3]: the expiries, a sorted set (entry name, scored by its expiry
--          in Unix ms)
-- ARGV[1]: the number of the version the instance holds; ARGV[2]: the
-- new version's nonce; ARGV[3]: 0: no announcement, 1: PUBLISH, 2:
-- PUBLISH and SPUBLISH; ARGV[4]: the channel; ARGV[5...]: the entries, as
-- name, JSON, expiry (Unix ms, 0: none), stamp ms, stamp n, stamp origin.
-- When an entry is written, the version moves on, beyond both the one
-- found and the one held, and the change is announced as "<previous
-- version, or -> <new version> <names...>" (without names past 1000:
-- every instance reads the whole hash).
-- Returns {entries written, version found, version now}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local names = {}
for i = 5, #ARGV - 5, 6 do
  local name, expires = ARGV[i], tonumber(ARGV[i + 2]) or 0
  local mine = {tonumber(ARGV[i + 3]) or 0, tonumber(ARGV[i + 4]) or 0, ARGV[i + 5]}
  if (expires == 0 or expires > now) and
      (redis.call('HEXISTS', KEYS[1], name) == 0 or after(mine, stampOf(name))) then
    redis.call('HSET', KEYS[1], name, ARGV[i + 1])
    if expires > 0 then
      redis.call('ZADD', KEYS[3], expires, name)
    else
      redis.call('ZREM', KEYS[3], name)
    end
    names[#names + 1] = name
  end
end
local cur = redis.call('GET', KEYS[2]) or ''
if #names == 0 then
  return {0, cur, cur}
end
local had = tonumber(string.match(cur, '^(%d+)')) or 0
local held = tonumber(ARGV[1]) or 0
local next = string.format('%.0f', math.max(had, held) + 1) .. ':' .. ARGV[2]
redis.call('SET', KEYS[2], next)
if ARGV[3] ~= '0' then
  local p = cur
  if p == '' then p = '-' end
  local msg = p .. ' ' .. next
  if #names <= 1000 then msg = msg .. ' ' .. table.concat(names, ' ') end
  redis.pcall('PUBLISH', ARGV[4], msg)
  if ARGV[3] == '2' then redis.pcall('SPUBLISH', ARGV[4], msg) end
end
return {#names, cur, next}
