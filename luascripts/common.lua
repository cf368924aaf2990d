-- Prepended to every algorithm's script (not to ban.lua): the arguments,
-- the clock, and run, which decides every key of the call, all or nothing.
--
-- KEYS: one bucket per key (in a cluster, all in one hash slot).
-- ARGV[1]: the time in microseconds, or "" for the server's clock (TIME).
-- ARGV[2]: the mode: "take" charges the costs if every key allows them,
--          else none; "refund" gives back what the takes' charges still
--          hold back (see taken); "peek" decides and stores
--          no decision; "release" gives back a lease (concurrency only);
--          "charge" charges the costs whatever the buckets hold, into
--          debt (token and leaky buckets: see gcra.lua; the fixed window
--          and the sliding window counter count past the limit).
-- ARGV[3 + 6(i-1) ... 8 + 6(i-1)]: KEYS[i]'s six arguments, as args(i)
--          reads them: rate, period (µs), burst, cost, flag, id. Each
--          script says which it uses, and what they mean to it. In refund
--          mode, flag is the take's: "<at>:<end>" (see taken).
-- ARGV[3 + 6n ...] (n keys), optional: a batch of requests decided in
--          one call, as the number of keys of each, in order. Without
--          them, all the keys are one request's.
--
-- A batch of a cluster node's requests whose keys are in several slots
-- (a call may declare keys of one slot only) declares no keys: ARGV[1] is
-- then the number of keys n, ARGV[2 .. n + 1] the keys, and the arguments
-- above follow. Its keys must all be the node's.
--
-- Each request's keys are decided all or nothing, then the next
-- request's (which sees what the first wrote). Returns integers only (the
-- store reads replies as lists of integers: any other element would fail
-- its whole pipeline): { now, then for each request: all allowed (1/0),
-- then for each of its keys: allowed (1/0), remaining, µs until the reset
-- (each script says what it is), µs until the same request could pass (0
-- when allowed), µs to wait before passing }. In a batch, a request whose
-- keys make the script fail (a key of another type) shows -1 (WRONGTYPE)
-- or -2 (another error) instead of all allowed, and zeros for its keys;
-- the others are decided all the same. An error that says the server
-- cannot serve (OOM, READONLY...) fails the whole call. In a batch that
-- declares no keys, a request whose keys are not the node's (its slot
-- moved, or the node is a replica now), or that the cluster being down
-- stopped (or a server that refuses keys a script did not declare), and
-- that did nothing yet that it would do twice if sent again (see dirty),
-- shows -3: the caller sends it again alone, with its keys declared (then
-- Redis redirects it, or says why it cannot serve it). One that did (while
-- its slot migrates, a key it reaches after another may have moved: a
-- refund without id gave back its first key) shows -2, as in a call of
-- its own.

-- the keys and arguments, declared or not (see above)
local KEYS, ARGV, undeclared = KEYS, ARGV, #KEYS == 0
if undeclared then
  local n = tonumber(ARGV[1])
  KEYS, ARGV = { unpack(ARGV, 2, n + 1) }, { unpack(ARGV, n + 2) }
end

-- In a call that declares no keys, dirty says whether the request being
-- decided did anything yet that sending it again would do twice
-- (redis.call and redis.pcall are wrapped to tell): only one that did not
-- may be sent again (-3 above). Reads may run again, and so may removals
-- of expired entries (ZREMRANGEBYSCORE up to now) and of named members
-- (ZREM: a lease, a refund by id), which find nothing the second time;
-- a write of a bucket, an added member or a removal of members by their
-- time (a refund without id, which marks dirty itself) may not.
local dirty, redis = false, redis
if undeclared then
  local call, pcall_ = redis.call, redis.pcall
  local again = { GET = true, TIME = true, ZCARD = true, ZCOUNT = true, ZRANGE = true, ZSCORE = true,
    ZREMRANGEBYSCORE = true, ZREM = true, PEXPIRE = true }
  local function mark(cmd, reply)
    if not again[cmd] and not (type(reply) == 'table' and reply.err) then
      dirty = true
    end
    return reply
  end
  redis = setmetatable({
    call = function(cmd, ...) return mark(cmd, call(cmd, ...)) end,
    pcall = function(cmd, ...) return mark(cmd, pcall_(cmd, ...)) end,
  }, { __index = redis })
end

-- now, in microseconds, is ARGV[1] when the caller gives a time (tests),
-- else the Redis server's clock, so that gateways whose clocks disagree
-- agree on every bucket.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local mode = ARGV[2]
local refund = mode == 'refund'
local charge = mode == 'charge'
local peek = mode == 'peek'
local eps = 1e-9 -- absorbs float rounding: a count of 2.9999999999 is 3

-- MaxCost in Go: the largest limit (2^40 + 1). A cost may be anything up
-- to 2^63 - 1 (a placeholder's), which a double does not even hold
-- exactly: a cost above max_cost counts as max_cost + 1, more than any
-- limit, so that it is refused as any cost over the limit is, and no sum
-- or loop grows with it; a negative (or not a number) cost counts as none.
local max_cost = 1099511627777

local function bounded_cost(v)
  local cost = tonumber(v)
  if not cost or not (cost >= 0) then
    return 0
  end
  return math.min(cost, max_cost + 1)
end

-- the six arguments of KEYS[i]; numbers but for flag and id, kept as given.
-- The table is the previous key's when its six arguments are the same
-- (the same zone's requests in a batch: a tenth of a decision's time); the
-- scripts only read it (and taken keeps what it parsed of the flag).
local last_a, last_k
local function args(i)
  local a = 3 + (i - 1) * 6
  local b = last_a
  if b and ARGV[a] == ARGV[b] and ARGV[a + 1] == ARGV[b + 1] and ARGV[a + 2] == ARGV[b + 2]
      and ARGV[a + 3] == ARGV[b + 3] and ARGV[a + 4] == ARGV[b + 4] and ARGV[a + 5] == ARGV[b + 5] then
    return last_k
  end
  last_a, last_k = a, {
    rate = tonumber(ARGV[a]), period = tonumber(ARGV[a + 1]),
    burst = tonumber(ARGV[a + 2]), cost = bounded_cost(ARGV[a + 3]),
    flag = ARGV[a + 4], id = ARGV[a + 5],
  }
  return last_k
end

-- A refund's flag is its take's: "<at>:<end>", in µs, the time of the
-- take's decision (the time in its reply: the window it counted in) and the
-- end of its charge (its reply's now + reset: when a token bucket that
-- charge left was full again, or a leaky bucket's queue drained). Only a
-- refund reads it; taken returns both, parsed once per argument table.
-- Refunds are made at their own time (now): a GCRA's charge still holds
-- back, then, what of it has not drained by now (see gcra.lua).
local function taken(k)
  if not k.at then
    local at, e = string.match(k.flag, '^(%d+):(%d+)$')
    if not at then
      error('refund without its take (flag "' .. k.flag .. '", want "<at>:<end>")')
    end
    k.at, k.e = tonumber(at), tonumber(e)
  end
  return k.at, k.e
end

-- us microseconds in whole milliseconds (for PX and PEXPIRE), rounded up,
-- at least 1
local function ttl_ms(us)
  return math.max(math.ceil(us / 1000), 1)
end

-- The windows (fixed, sliding counter) start at multiples of their length
-- and are known in Redis by a tag: the window's index since the Unix
-- epoch, modulo a million, which tells a key's window from the ones
-- around it (a key lives at most max_carry + 2 windows past its last
-- write) in six digits instead of a 16-digit start. window_tag is the tag
-- of the window that starts at start.
local function window_tag(start, window)
  return (start / window) % 1000000
end

-- A window's count goes past its limit by "charge" (a zone that syncs
-- charges what its instances admitted, which may be more than the limit
-- left): what went over is carried into the next window, as a token
-- bucket's debt is repaid, so that over any period the windows admit the
-- limit of each and what the last one went over, never more. Only a zone
-- that syncs carries (its keys' flag is "2"): an exact zone's count is
-- past the limit only when the limit fell (a reload, an override that
-- ended), which is no one's overshoot. A count of limit + x starts the
-- next window at min(x, limit), and no later window: an outage's charges
-- (a burst from each instance) hold the client back one window at most.
-- carries tells whether k, a key's arguments, carries; carry_windows how
-- many windows after its own a count still weighs on (0 or 1).
local function carries(k)
  return k.flag == '2'
end

local function carry_windows(count, limit, carry)
  if not carry or not (limit > 0) or count <= limit then
    return 0
  end
  return 1
end

-- windows_since is how many windows passed from the window tagged from to
-- the one tagged to (tags wrap at a million).
local function windows_since(from, to)
  return (to - from) % 1000000
end

-- decide_request decides the keys first .. last of one request with
-- decide(key, args), which returns the key's state: ok (allowed),
-- remaining, reset, retry and delay (retry and delay default to 0; a
-- quota, which has no delay, gives its count as used in its place) for the
-- reply, and what write needs. When every key is allowed and the call is
-- no peek, write(key, state) stores each key's state (in refund and
-- release modes too: write knows whether to). Appends the request's reply
-- to out.
local function decide_request(decide, write, first, last, out, touch)
  local all, state = true, {}
  for i = first, last do
    state[i] = decide(KEYS[i], args(i))
    all = all and state[i].ok
  end
  local o = #out + 1
  out[o] = all and 1 or 0
  for i = first, last do
    local s = state[i]
    if all and not peek then
      write(KEYS[i], s)
    elseif s.own and touch and not peek then -- a refusal that a key still records (see touch in gcra.lua)
      touch(KEYS[i], s)
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = s.ok and 1 or 0, s.remaining, s.reset,
      s.retry or 0, s.delay or s.used or 0
    o = o + 5
  end
end

-- run decides the call's requests (see decide_request), and returns the
-- reply.
local function run(decide, write, touch)
  local out, n = { now }, #KEYS
  if #ARGV < 3 + 6 * n then -- one request
    decide_request(decide, write, 1, n, out, touch)
    return out
  end
  -- batch_error is the reply of a request of a batch that err made fail: -1
  -- for WRONGTYPE, -2 for another error of the script (a stored value it
  -- did not expect), -3 for keys that are not the node's in a batch that
  -- declares none, when the request may be sent again (see dirty); nil,
  -- and the error as Redis would reply it, for an error that says the
  -- server cannot serve. (Defined here: a call of one request does not pay
  -- for it.)
  local function batch_error(err)
    local msg = type(err) == 'table' and tostring(err.err) or tostring(err)
    -- (Redis 6 puts where the script failed in front: "@user_script: 12: ")
    msg = string.match(msg, '^@[%w_]+: ?%d+: %-?(.*)$') or msg
    local code = string.match(msg, '^(%u+) ')
    -- the codes that say the server cannot serve (see Unavailable in Go)
    local unavailable = { LOADING = true, CLUSTERDOWN = true, MASTERDOWN = true, TRYAGAIN = true, READONLY = true,
      BUSY = true, OOM = true, NOREPLICAS = true, MISCONF = true, NOPERM = true }
    if code == 'WRONGTYPE' then
      return -1
    elseif undeclared and not dirty and (code == 'READONLY' or string.find(msg, 'non local key', 1, true)
        or string.find(msg, 'cluster is down', 1, true) or string.find(msg, 'undeclared', 1, true)) then
      return -3
    elseif unavailable[code] then
      return nil, redis.error_reply(msg)
    end
    return -2
  end
  local first = 1
  for a = 3 + 6 * n, #ARGV do
    local last, mark = first + tonumber(ARGV[a]) - 1, #out
    dirty = false
    local ok, err = pcall(decide_request, decide, write, first, last, out, touch)
    if not ok then
      local code, fatal = batch_error(err)
      if not code then
        error(fatal)
      end
      for j = #out, mark + 1, -1 do
        out[j] = nil
      end
      out[mark + 1] = code
      for j = mark + 2, mark + 1 + 5 * (last - first + 1) do
        out[j] = 0
      end
    end
    first = last + 1
  end
  return out
end
