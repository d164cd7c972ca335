-- Shared by every transition script: idemd prepends this file to each script when it
-- loads them, so each script still runs as one EVALSHA on one key.
--
-- The scripts are the second copy of the rules in internal/engine/rules.go, which
-- Redis cannot run; enginetest.Rules holds both to the same table. Change a rule in
-- both places.
--
-- Every script gets three keys: KEYS[1] the record's key in the layouts of earlier
-- releases (idem:<tenant>:<hex SHA-256 of the client's key>), which is also the name of
-- its change channel, KEYS[2] its key in the lean layout, and KEYS[3] the tenant's
-- pending index of that Cluster slot, all three in the same slot. The index is a sorted
-- set of the client's keys of the slot's pending records, scored by lease expiry (ms),
-- which the abandoned-keys feed reads: a record is in it while it is pending (index
-- keeps it so), and until the feed meets the entry of a record that expired pending,
-- which it removes.
-- Usage: a script counts what it changes of the tenant's usage in ACCT, and answers it
-- (see answer): the daemon adds it up and folds it into the tenant's totals, apart from
-- the script (internal/engine/redisstore/usage.go), because those live in one slot of
-- their own and a script reaches only its record's. ACCT is a flat list of triples
-- {span, records, bytes}, a span being the USAGE_SPAN_MS its record's expiry falls in:
-- span k holds the expiries in ((k-1)*USAGE_SPAN_MS, k*USAGE_SPAN_MS]. A record's bytes
-- are its key and its stored value as Redis keeps them, and the size of a result it
-- keeps in the blob store (blob_bytes). save moves a record's count
-- from what load read (size0 bytes to expire at xa0) to what it writes, and purge takes
-- it away; expiry, which no script sees, is the reader's to count (it drops the spans
-- that have ended). ACCT is nil for a script that changed nothing.
-- load reads the key WRITE_LAYOUT writes, then (when READ_OTHER is set) the other one;
-- save writes the record in WRITE_LAYOUT at that layout's key and deletes it at the
-- other, so a record is in one place. lua.go sets both globals.
--
-- Layout 3 (lean, at KEYS[2]): one string, LAYOUT_LEAN then the fields below in this
-- order, packed with MessagePack (Redis's cmsgpack); an absent field is nil. The key
-- and the tenant are not kept (the Redis key says them); lx, ua and xa are ms after ca;
-- rs is a number; rec and w are 1 or nil; tok, fp and cs are as the daemon compacts
-- them (hex digests as bytes) and rh as it packs headers (lua cannot tell either
-- apart, and need not: it only compares them for equality).
-- Layout 2 (at KEYS[1]): LAYOUT_STRING then k, t and the same fields, times absolute,
-- everything as the daemon sent it unpacked. Layout 1 (at KEYS[1]): a hash of the same
-- fields, all strings; earlier releases wrote it.
-- Fields:
--   k   the client's key          t   tenant          st  state: p, r, c or f
--   fp  fingerprint               ow  owner           at  attempt
--   tok current (or last) lease token                 lx  lease expiry, ms
--   rec '1' when the lease was taken over after expiry, else '0'
--   cs  SHA-256 of the current lease's claim secret (never part of an answer)
--   w   '1' once a claim waited on the record: only then do changes PUBLISH
--   ca  created, ms   ua  updated, ms   xa  when the record expires, ms
--   rs  response status   rh  response headers   rb  response body, raw bytes
--   pn  recovery point's name     pd  its data, raw bytes
--   pa  the attempt that recorded it                  pt  when, ms (ms after ca in lean)
-- The key expires at xa.
-- Markers: a live move to another store (docs/moving.md) replaces a record it
-- hands over with a marker, st 'm' (moving) or 'x' (moved), in any layout. load
-- refuses a marker, and any state but p, r, c and f, with the error STOREMOVED, which
-- the daemon answers as the key moved (engine.ErrStoreMoved): no script reads it as
-- absent, so none takes the key or writes over the marker, and none reads a record
-- from it.
-- The recovery point's fields come last in both string layouts, so that a daemon of an
-- earlier release reads such a record (and drops the point if it writes it).
--
-- Every script answers {status, now_ms, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa
-- [, rs, rh, rb [, pn, pd, pa, pt]]}, each a string or an integer ('' for none): the
-- response when it is replayed or looked up, and the recovery point whenever there is
-- one. In place of k the answer carries what the script moved in the usage (ACCT, or
-- ''), and t is always '': the daemon asked for the record and knows both, and the
-- lean layout does not keep them. A script reads the record
-- once (load), writes it at most once (save) and answers from what it read and wrote
-- (answer): each redis.call inside a script costs about as much as a small command.
-- Fields are named one by one rather than looped over, and numbers stay numbers: on a
-- fresh key the loops and the formatting cost Redis as much as the commands.
-- Redis runs this prelude again at every call, so it builds no table and holds few
-- functions: each costs an allocation a call. A number handed to redis.call is
-- written as an integer while it is one.
local LAYOUT_STRING, LAYOUT_LEAN = 2, 3
local LEGACY, LEAN, INDEX = KEYS[1], KEYS[2], KEYS[3]
local USAGE_SPAN_MS = 10000
local ACCT = nil
local W3 = WRITE_LAYOUT == LAYOUT_LEAN

-- blob_bytes is the size of the result a record keeps in the blob store, as the
-- reference in its headers rh (engine.BlobHeader, 'name size sha256') names it, or 0:
-- a record counts that size besides its own. rh is packed (an entry 'Idemd-Blob:…'
-- at its start or after a newline) or JSON ('"Idemd-Blob":["…'); a record without the
-- name costs one plain find.
local function blob_bytes(rh)
  if not rh or not string.find(rh, 'Idemd-Blob', 1, true) then
    return 0
  end
  local n = string.match(rh, '^Idemd%-Blob:%S+ (%d+) ') or string.match(rh, '\nIdemd%-Blob:%S+ (%d+) ') or
    string.match(rh, '"Idemd%-Blob":%["%S+ (%d+) ')
  return tonumber(n) or 0
end

-- The fields of a hash record (layout 1), in the order of the string layouts.
local function hash_fields()
  return {'k', 't', 'st', 'fp', 'ow', 'at', 'tok', 'lx', 'rec', 'ca', 'ua', 'xa',
    'rs', 'rh', 'rb', 'cs', 'w', 'pn', 'pd', 'pa', 'pt', 'ms', 'mx'}
end

-- Time comes from Redis, never from a daemon, so that daemons with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the daemon's form of a value to write (ARGV[compact] in the lean layout, else
-- ARGV[raw]), and whether a stored value is the same as the request's in either form.
local function form(raw, compact)
  if W3 then
    return compact
  end
  return raw
end

local function same(stored, raw, compact)
  return stored == raw or stored == compact
end

-- READ_MARKERS is set by the scripts of a live move (moveout, confirm, peek), which
-- read markers: a moving marker keeps the record whole, its state in ms and its expiry
-- (ms since the epoch, in every layout) in mx, after every other field.
local READ_MARKERS = false

-- moved stops the script, having changed nothing, when st is not a record's state
-- (p, r, c or f).
local function moved(st, key)
  if st and st ~= 'p' and st ~= 'c' and st ~= 'r' and st ~= 'f' and not READ_MARKERS then
    error({err = 'STOREMOVED the record of ' .. key .. ' has moved to another store'})
  end
end

local function unpack_legacy()
  local v = redis.pcall('GET', LEGACY)
  if not v then
    return {}
  end
  if type(v) == 'table' then
    if not (v.err and string.find(v.err, 'WRONGTYPE', 1, true)) then
      error(v.err or 'GET failed')
    end
    -- A hash, as earlier releases write: an empty field is an absent one.
    local FIELDS = hash_fields()
    local vals = redis.call('HMGET', LEGACY, unpack(FIELDS))
    local r = {legacy = true, hash = true}
    local size = #LEGACY
    for i = 1, #FIELDS do
      if vals[i] and vals[i] ~= '' then
        r[FIELDS[i]] = vals[i]
        size = size + #FIELDS[i] + #vals[i]
      end
    end
    moved(r.st, LEGACY)
    r.had_point = r.pt ~= nil
    r.size0, r.xa0 = size + blob_bytes(r.rh), r.xa
    return r
  end
  local layout, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa, rs, rh, rb, cs, w, pn, pd, pa, pt, ms, mx =
    cmsgpack.unpack(v)
  if layout ~= LAYOUT_STRING then
    error('record ' .. LEGACY .. ' has an unknown layout')
  end
  moved(st, LEGACY)
  return {legacy = true, k = k, t = t, st = st, fp = fp, ow = ow, at = at, tok = tok,
    lx = lx, rec = rec, ca = ca, ua = ua, xa = xa, rs = rs, rh = rh, rb = rb, cs = cs, w = w,
    pn = pn, pd = pd, pa = pa, pt = pt, ms = ms, mx = mx, size0 = #LEGACY + #v + blob_bytes(rh), xa0 = xa}
end

local function unpack_lean()
  local v = redis.call('GET', LEAN)
  if not v then
    return {}
  end
  local layout, st, fp, ow, at, tok, lx, rec, ca, ua, xa, rs, rh, rb, cs, w, pn, pd, pa, pt, ms, mx =
    cmsgpack.unpack(v)
  if layout ~= LAYOUT_LEAN then
    error('record ' .. LEAN .. ' has an unknown layout')
  end
  moved(st, LEAN)
  if lx then
    lx = ca + lx
  end
  if pt then
    pt = ca + pt
  end
  return {lean = true, st = st, fp = fp, ow = ow, at = at, tok = tok, lx = lx,
    rec = rec and '1' or '0', ca = ca, ua = ca + ua, xa = ca + xa, rs = rs, rh = rh, rb = rb,
    cs = cs, w = w and '1' or nil, pn = pn, pd = pd, pa = pa, pt = pt, ms = ms, mx = mx,
    size0 = #LEAN + #v + blob_bytes(rh), xa0 = ca + xa}
end

-- load returns the record's fields by name; an absent record has none (r.st is nil).
local function load()
  local first, other = unpack_legacy, unpack_lean
  if W3 then
    first, other = unpack_lean, unpack_legacy
  end
  local r = first()
  if r.st or not READ_OTHER then
    return r
  end
  return other()
end

-- account moves the record's count from what load read of it (size0 bytes to expire at
-- xa0, or nothing for an absent record) to size bytes to expire at r.xa, or to nothing
-- when size is nil (purge), in ACCT: one triple where the span stays, as it does for
-- most transitions, two where it moves. It writes nothing to Redis: the daemon does,
-- for many calls at once.
local function account(r, size)
  local from, to = nil, nil
  if size then
    size = size + blob_bytes(r.rh)
  end
  if r.size0 then
    from = math.ceil(tonumber(r.xa0) / USAGE_SPAN_MS)
  end
  if size then
    to = math.ceil(tonumber(r.xa) / USAGE_SPAN_MS)
  end
  -- Built whole by one constructor: most scripts account once, and a table grown an
  -- element at a time is reallocated as it grows.
  local moved
  if from and from == to then
    if size ~= r.size0 then
      moved = {to, 0, size - r.size0}
    end
  elseif from and to then
    moved = {from, -1, -r.size0, to, 1, size}
  elseif from then
    moved = {from, -1, -r.size0}
  elseif to then
    moved = {to, 1, size}
  end
  if not ACCT then
    ACCT = moved
  elseif moved then
    for i = 1, #moved do
      ACCT[#ACCT + 1] = moved[i]
    end
  end
  -- A second save in the same script moves the count from here.
  r.size0, r.xa0 = size, r.xa
end

-- save writes r whole as the record, to expire at r.xa, and counts it in the usage.
local function save(r)
  if W3 then
    if r.legacy then
      redis.call('DEL', LEGACY)
    end
    local ca, lx = tonumber(r.ca), tonumber(r.lx or '0')
    if lx > 0 then
      lx = lx - ca
    else
      lx = nil
    end
    local rec, w, pt = nil, nil, nil
    if r.rec == '1' then
      rec = 1
    end
    if r.w == '1' then
      w = 1
    end
    if r.pt then
      pt = tonumber(r.pt) - ca
    end
    local v
    if r.ms then
      v = cmsgpack.pack(LAYOUT_LEAN, r.st, r.fp, r.ow, tonumber(r.at), r.tok,
        lx, rec, ca, tonumber(r.ua) - ca, tonumber(r.xa) - ca, tonumber(r.rs), r.rh, r.rb, r.cs,
        w, r.pn, r.pd, tonumber(r.pa), pt, r.ms, tonumber(r.mx))
      redis.call('SET', LEAN, v, 'PXAT', r.xa)
      account(r, #LEAN + #v)
      return
    end
    v = cmsgpack.pack(LAYOUT_LEAN, r.st, r.fp, r.ow, tonumber(r.at), r.tok,
      lx, rec, ca, tonumber(r.ua) - ca, tonumber(r.xa) - ca, tonumber(r.rs), r.rh, r.rb, r.cs,
      w, r.pn, r.pd, tonumber(r.pa), pt)
    redis.call('SET', LEAN, v, 'PXAT', r.xa)
    account(r, #LEAN + #v)
    return
  end
  if r.lean then
    redis.call('DEL', LEAN)
  end
  if WRITE_LAYOUT == 1 then
    if not r.hash then
      redis.call('DEL', LEGACY)
    end
    local FIELDS = hash_fields()
    local kv = {}
    local size = #LEGACY
    for i = 1, #FIELDS do
      local x = r[FIELDS[i]]
      if x then
        kv[#kv + 1] = FIELDS[i]
        kv[#kv + 1] = x
        -- An empty field reads as an absent one (unpack_legacy), and counts as one, so
        -- that what a record adds to the usage is what taking it away subtracts.
        if x ~= '' then
          size = size + #FIELDS[i] + #tostring(x)
        end
      end
    end
    redis.call('HSET', LEGACY, unpack(kv))
    -- HSET leaves the fields it is not given: a dropped recovery point is deleted.
    if r.had_point and not r.pt then
      redis.call('HDEL', LEGACY, 'pn', 'pd', 'pa', 'pt')
    end
    redis.call('PEXPIREAT', LEGACY, r.xa)
    account(r, size)
    return
  end
  local v
  if r.ms then
    v = cmsgpack.pack(LAYOUT_STRING, r.k, r.t, r.st, r.fp, r.ow, r.at, r.tok,
      r.lx, r.rec, r.ca, r.ua, r.xa, r.rs, r.rh, r.rb, r.cs, r.w, r.pn, r.pd, r.pa, r.pt, r.ms, r.mx)
  else
    v = cmsgpack.pack(LAYOUT_STRING, r.k, r.t, r.st, r.fp, r.ow, r.at, r.tok,
      r.lx, r.rec, r.ca, r.ua, r.xa, r.rs, r.rh, r.rb, r.cs, r.w, r.pn, r.pd, r.pa, r.pt)
  end
  redis.call('SET', LEGACY, v, 'PXAT', r.xa)
  account(r, #LEGACY + #v)
end

-- index keeps the record's entry in the pending index, under the client's key: its
-- lease's expiry while it is pending, none otherwise.
local function index(r, key)
  if r.st == 'p' then
    redis.call('ZADD', INDEX, r.lx, key)
  else
    redis.call('ZREM', INDEX, key)
  end
end

-- answer's third field, where earlier releases answered the client's key, is what the
-- script moved in the usage (ACCT), or '' when nothing.
local function answer(status, now, r, with_response)
  local acct = ACCT or ''
  if r.pt then
    local rs, rh, rb = '', '', ''
    if with_response then
      rs, rh, rb = r.rs or '', r.rh or '', r.rb or ''
    end
    return {status, now, acct, '', r.st or '', r.fp or '', r.ow or '',
      r.at or '', r.tok or '', r.lx or '', r.rec or '', r.ca or '', r.ua or '', r.xa or '',
      rs, rh, rb, r.pn or '', r.pd or '', r.pa or '', r.pt}
  end
  if with_response then
    return {status, now, acct, '', r.st or '', r.fp or '', r.ow or '',
      r.at or '', r.tok or '', r.lx or '', r.rec or '', r.ca or '', r.ua or '', r.xa or '',
      r.rs or '', r.rh or '', r.rb or ''}
  end
  return {status, now, acct, '', r.st or '', r.fp or '', r.ow or '',
    r.at or '', r.tok or '', r.lx or '', r.rec or '', r.ca or '', r.ua or '', r.xa or ''}
end

-- notify wakes the daemons waiting on the record, once a watch or a waiting claim
-- marked it. Redis 7 has sharded pub/sub: on a Cluster, SPUBLISH reaches only the
-- nodes of the key's shard, PUBLISH every node. Daemons subscribe the same way (see
-- notify.go), on the same test of the version.
local function notify(r, msg)
  if r.w ~= '1' then
    return
  end
  if (redis.REDIS_VERSION_NUM or 0) >= 0x070000 then
    redis.call('SPUBLISH', LEGACY, msg)
  else
    redis.call('PUBLISH', LEGACY, msg)
  end
end
