-- Reads entries of the overrides' hash, leaving out those too long to be
-- an override's: a reply stays bounded whatever the hash holds.
-- KEYS[1]: the hash of the overrides (entry name -> JSON)
-- ARGV[1]: the longest name read; ARGV[2]: the longest value read;
-- ARGV[3]: 'scan' (a page of the hash) or 'get' (the entries named);
-- scan: ARGV[4]: HSCAN's cursor; ARGV[5]: its COUNT;
-- get: ARGV[4...]: the names.
-- Returns {next cursor ('0': the end; always '0' for get), {name, value,
-- ...} of the entries that fit, {the name's first ARGV[1] bytes, the
-- name's length, the value's length, ...} of those that do not}. An entry
-- named that does not exist is in neither list.
local maxName, maxValue = tonumber(ARGV[1]), tonumber(ARGV[2])
local fit, big = {}, {}
local function tooBig(name, name_len, value_len)
  big[#big + 1] = string.sub(name, 1, maxName)
  big[#big + 1] = name_len
  big[#big + 1] = value_len
end
local cursor = '0'
if ARGV[3] == 'scan' then
  local page = redis.call('HSCAN', KEYS[1], ARGV[4], 'COUNT', ARGV[5])
  cursor = page[1]
  local e = page[2]
  for i = 1, #e, 2 do
    if #e[i] > maxName or #e[i + 1] > maxValue then
      tooBig(e[i], #e[i], #e[i + 1])
    else
      fit[#fit + 1] = e[i]
      fit[#fit + 1] = e[i + 1]
    end
  end
else
  for i = 4, #ARGV do
    local n = redis.call('HSTRLEN', KEYS[1], ARGV[i])
    if n > maxValue then
      tooBig(ARGV[i], #ARGV[i], n)
    elseif n > 0 or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
      fit[#fit + 1] = ARGV[i]
      fit[#fit + 1] = redis.call('HGET', KEYS[1], ARGV[i])
    end
  end
end
return {cursor, fit, big}
