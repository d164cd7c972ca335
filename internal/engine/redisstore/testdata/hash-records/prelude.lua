-- Shared by every transition script: idemd prepends this file to each script when it
-- loads them, so each script still runs as one EVALSHA on one key.
--
-- The scripts are the second copy of the rules in internal/engine/rules.go, which
-- Redis cannot run; enginetest.Rules holds both to the same table. Change a rule in
-- both places.
--
-- A record is one hash. Fields:
--   k   the client's key          t   tenant          st  state: p, r, c or f
--   fp  fingerprint               ow  owner           at  attempt
--   tok current (or last) lease token                 lx  lease expiry, ms
--   rec 1 when the lease was taken over after expiry
--   cs  SHA-256 of the current lease's claim secret (never part of an answer)
--   w   1 once a claim waited on the record: only then do changes PUBLISH
--   ca  created, ms   ua  updated, ms   xa  when the record expires, ms
--   rs  response status   rh  response headers, JSON   rb  response body, raw bytes
--
-- Every script answers {status, now_ms, <META fields...>[, rs, rh, rb]}. A script
-- reads the record once (load) and answers from what it read and wrote (answer):
-- each redis.call inside a script costs about as much as a small command.
local META = {'k', 't', 'st', 'fp', 'ow', 'at', 'tok', 'lx', 'rec', 'ca', 'ua', 'xa'}
local FIELDS = {'k', 't', 'st', 'fp', 'ow', 'at', 'tok', 'lx', 'rec', 'ca', 'ua', 'xa',
  'rs', 'rh', 'rb', 'cs', 'w'}

-- Time comes from Redis, never from a daemon, so that daemons with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers as decimal strings: Lua's own number formatting switches to exponent form.
local function int(n)
  return string.format('%.0f', n)
end

-- load returns the record's fields by name; an absent record has none (r.st is nil).
local function load(key)
  local vals = redis.call('HMGET', key, unpack(FIELDS))
  local r = {}
  for i = 1, #FIELDS do
    r[FIELDS[i]] = vals[i]
  end
  return r
end

-- set writes fields (name, value, name, value, ...) to the record and to r.
local function set(key, r, ...)
  local kv = {...}
  for i = 1, #kv, 2 do
    r[kv[i]] = kv[i + 1]
  end
  redis.call('HSET', key, ...)
end

local function answer(status, now, r, with_response)
  local out = {status, int(now)}
  for i = 1, #META do
    out[i + 2] = r[META[i]] or ''
  end
  if with_response then
    out[15], out[16], out[17] = r.rs or '', r.rh or '', r.rb or ''
  end
  return out
end

-- notify wakes the daemons waiting on the record, once a watch or a waiting claim
-- marked it. Redis 7 has sharded pub/sub: on a Cluster, SPUBLISH reaches only the
-- nodes of the key's shard, PUBLISH every node. Daemons subscribe the same way (see
-- notify.go), on the same test of the version.
local function notify(key, r, msg)
  if r.w ~= '1' then
    return
  end
  if (redis.REDIS_VERSION_NUM or 0) >= 0x070000 then
    redis.call('SPUBLISH', key, msg)
  else
    redis.call('PUBLISH', key, msg)
  end
end
