-- The previous release's lua.Source put this line before the prelude, for its default
-- layout (strings).
local HASH_RECORDS = false
-- Shared by every transition script: idemd prepends this file to each script when it
-- loads them, so each script still runs as one EVALSHA on one key.
--
-- The scripts are the second copy of the rules in internal/engine/rules.go, which
-- Redis cannot run; enginetest.Rules holds both to the same table. Change a rule in
-- both places.
--
-- A record is one string under its own key: LAYOUT, then the fields below in this
-- order, packed with MessagePack (Redis's cmsgpack); an absent field is nil. Times,
-- the attempt and the expiry are numbers, the rest strings. Earlier releases kept a
-- record as a hash of the same fields, all strings; load reads both layouts, and save
-- writes a string, or a hash while HASH_RECORDS is set (lua.go sets it, for a rolling
-- upgrade: daemons of an earlier release read only hashes). Fields:
--   k   the client's key          t   tenant          st  state: p, r, c or f
--   fp  fingerprint               ow  owner           at  attempt
--   tok current (or last) lease token                 lx  lease expiry, ms
--   rec '1' when the lease was taken over after expiry, else '0'
--   cs  SHA-256 of the current lease's claim secret (never part of an answer)
--   w   '1' once a claim waited on the record: only then do changes PUBLISH
--   ca  created, ms   ua  updated, ms   xa  when the record expires, ms
--   rs  response status   rh  response headers, JSON   rb  response body, raw bytes
-- The key expires at xa.
--
-- Every script answers {status, now_ms, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa
-- [, rs, rh, rb]}, each a string or an integer ('' for none). A script reads the record
-- once (load), writes it at most once (save) and answers from what it read and wrote
-- (answer): each redis.call inside a script costs about as much as a small command.
-- Fields are named one by one rather than looped over, and numbers stay numbers: on a
-- fresh key the loops and the formatting cost Redis as much as the commands.
local LAYOUT = 2
local FIELDS = {'k', 't', 'st', 'fp', 'ow', 'at', 'tok', 'lx', 'rec', 'ca', 'ua', 'xa',
  'rs', 'rh', 'rb', 'cs', 'w'}

-- Time comes from Redis, never from a daemon, so that daemons with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- load returns the record's fields by name; an absent record has none (r.st is nil).
local function load(key)
  local v = redis.pcall('GET', key)
  if not v then
    return {}
  end
  if type(v) == 'table' then
    if not (v.err and string.find(v.err, 'WRONGTYPE', 1, true)) then
      error(v.err or 'GET failed')
    end
    -- A hash, as earlier releases write: an empty field is an absent one.
    local vals = redis.call('HMGET', key, unpack(FIELDS))
    local r = {hash = true}
    for i = 1, #FIELDS do
      if vals[i] and vals[i] ~= '' then
        r[FIELDS[i]] = vals[i]
      end
    end
    return r
  end
  local layout, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa, rs, rh, rb, cs, w =
    cmsgpack.unpack(v)
  if layout ~= LAYOUT then
    error('record ' .. key .. ' has an unknown layout')
  end
  return {k = k, t = t, st = st, fp = fp, ow = ow, at = at, tok = tok, lx = lx, rec = rec,
    ca = ca, ua = ua, xa = xa, rs = rs, rh = rh, rb = rb, cs = cs, w = w}
end

-- save writes r whole as the record, to expire at r.xa.
local function save(key, r)
  if HASH_RECORDS then
    if not r.hash then
      redis.call('DEL', key)
    end
    local kv = {}
    for i = 1, #FIELDS do
      local x = r[FIELDS[i]]
      if x then
        kv[#kv + 1] = FIELDS[i]
        kv[#kv + 1] = x
      end
    end
    redis.call('HSET', key, unpack(kv))
    redis.call('PEXPIREAT', key, r.xa)
    return
  end
  redis.call('SET', key, cmsgpack.pack(LAYOUT, r.k, r.t, r.st, r.fp, r.ow, r.at, r.tok, r.lx,
    r.rec, r.ca, r.ua, r.xa, r.rs, r.rh, r.rb, r.cs, r.w), 'PXAT', r.xa)
end

local function answer(status, now, r, with_response)
  if with_response then
    return {status, now, r.k or '', r.t or '', r.st or '', r.fp or '', r.ow or '',
      r.at or '', r.tok or '', r.lx or '', r.rec or '', r.ca or '', r.ua or '', r.xa or '',
      r.rs or '', r.rh or '', r.rb or ''}
  end
  return {status, now, r.k or '', r.t or '', r.st or '', r.fp or '', r.ow or '',
    r.at or '', r.tok or '', r.lx or '', r.rec or '', r.ca or '', r.ua or '', r.xa or ''}
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
