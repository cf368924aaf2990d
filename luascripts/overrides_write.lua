-- Writes one override, or deletes it, drops the expired ones, moves the
-- version on and announces the change, all at once.
-- KEYS[1]: the hash of the overrides (entry name -> JSON)
-- KEYS[2]: their version, "<n>:<nonce>"
-- KEYS[3]: the expiries, a sorted set (entry name, scored by its expiry
--          in Unix ms)
-- ARGV[1]: the entry's name; ARGV[2]: its JSON, '' to delete it;
-- ARGV[3]: its expiry (Unix ms, 0: none); ARGV[4]: the new version's nonce;
-- ARGV[5]: 0: no announcement, 1: PUBLISH, 2: PUBLISH and SPUBLISH;
-- ARGV[6]: the channel.
-- Entries expired by Redis's clock are dropped, at most 1000 per change.
-- The change is announced as "<previous version, or -> <new version>
-- <entry names...>" (the one written, then those dropped).
-- Returns {found, previous version, new version, refusal, dropped
-- names...}: found is 1 when the entry existed before; refusal is why the
-- announcement failed ('' when it went out: a user whose ACL lacks the
-- channel gets the change stored all the same). A delete of an entry that
-- does not exist, with nothing expired, changes nothing: the version stays.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
local prev = redis.call('GET', KEYS[2]) or ''
if ARGV[2] == '' and found == 0 and #gone == 0 then
  return {0, prev, prev, ''}
end
for _, name in ipairs(gone) do
  redis.call('HDEL', KEYS[1], name)
  redis.call('ZREM', KEYS[3], name)
end
local n = tonumber(string.match(prev, '^(%d+)')) or 0
local next = string.format('%.0f', n + 1) .. ':' .. ARGV[4]
redis.call('SET', KEYS[2], next)
local refusal = ''
if ARGV[5] ~= '0' then
  local p = prev
  if p == '' then p = '-' end
  local msg = p .. ' ' .. next .. ' ' .. ARGV[1]
  if #gone > 0 then msg = msg .. ' ' .. table.concat(gone, ' ') end
  local r = redis.pcall('PUBLISH', ARGV[6], msg)
  if type(r) == 'table' and r.err then refusal = r.err end
  if ARGV[5] == '2' then redis.pcall('SPUBLISH', ARGV[6], msg) end
end
local reply = {found, prev, next, refusal}
for _, name in ipairs(gone) do reply[#reply + 1] = name end
return reply
