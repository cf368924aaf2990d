-- Prepended to overrides_write.lua and overrides_restore.lua: the
-- stamps of the changes of overrides and their order.
--
-- stampOf is the stamp of the entry name of the hash KEYS[1]: {ms, n,
-- origin, deleted}; an entry past 2 KiB, or without a stamp, or that is
-- not JSON, is {0, 0, '', ...}: the earliest. after reports whether stamp
-- a comes after b: by ms, then n, then origin.
local function stampOf(name)
  if redis.call('HSTRLEN', KEYS[1], name) > 2048 then return {0, 0, '', false} end
  local ok, v = pcall(cjson.decode, redis.call('HGET', KEYS[1], name))
  if not ok or type(v) ~= 'table' then return {0, 0, '', false} end
  local s, deleted = v.stamp, v.deleted == true
  if type(s) ~= 'table' then return {0, 0, '', deleted} end
  local origin = s.origin
  if type(origin) ~= 'string' then origin = '' end
  return {tonumber(s.ms) or 0, tonumber(s.n) or 0, origin, deleted}
end
local function after(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  if a[2] ~= b[2] then return a[2] > b[2] end
  return a[3] > b[3]
end
