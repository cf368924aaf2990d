-- Writes one change of an override (the override, or its tombstone),
-- unless a later change of it is held, drops the expired ones, moves the
-- version on and announces the change, all at once.
-- KEYS[1]: the hash of the overrides (entry name -> JSON)
-- KEYS[2]: their version, "<n>:<nonce>"
-- KEYS[3]: the expiries, a sorted set (entry name, scored by its expiry
--          in Unix ms)
-- ARGV[1]: the entry's name; ARGV[2]: its JSON (a tombstone's,
-- {"deleted":true,...}, for a deletion); ARGV[3]: its expiry (Unix ms, 0:
-- none); ARGV[4]: the new version's nonce; ARGV[5]: 0: no announcement,
-- 1: PUBLISH, 2: PUBLISH and SPUBLISH; ARGV[6]: the channel; ARGV[7],
-- ARGV[8], ARGV[9]: the change's stamp (ms, n, origin).
-- Changes are ordered by their stamps (overrides_stamp.lua, in front of
-- this script). The change is written when
-- it comes after the entry held (or none is held).
-- Entries expired by Redis's clock are dropped, at most 1000 per change.
-- The change is announced as "<previous version, or -> <new version>
-- <entry names...>" (the one written, then those dropped).
-- Returns {found, previous version, new version, refusal, state, dropped
-- names...}: found is 1 when an override (not a tombstone) was held;
-- refusal is why the announcement failed ('' when it went out: a user
-- whose ACL lacks the channel gets the change stored all the same); state
-- is 'written', 'same' (this change was held) or 'later' (a later change
-- is held). When nothing is written or dropped, the version stays.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mine = {tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0, ARGV[9]}
local found, state, write = 0, 'written', true
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local held = stampOf(ARGV[1])
  if not held[4] then found = 1 end
  write = after(mine, held)
  if not write then
    state = 'later'
    if held[1] == mine[1] and held[2] == mine[2] and held[3] == mine[3] then state = 'same' end
  end
end
if write then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  if tonumber(ARGV[3]) > 0 then
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  else
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
local prev = redis.call('GET', KEYS[2]) or ''
if not write and #gone == 0 then
  return {found, prev, prev, '', state}
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
  local msg = p .. ' ' .. next
  if write then msg = msg .. ' ' .. ARGV[1] end
  if #gone > 0 then msg = msg .. ' ' .. table.concat(gone, ' ') end
  local r = redis.pcall('PUBLISH', ARGV[6], msg)
  if type(r) == 'table' and r.err then refusal = r.err end
  if ARGV[5] == '2' then redis.pcall('SPUBLISH', ARGV[6], msg) end
end
local reply = {found, prev, next, refusal, state}
for _, name in ipairs(gone) do reply[#reply + 1] = name end
return reply
