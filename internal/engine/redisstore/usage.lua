-- usage: fold what daemons counted into a tenant's usage totals, drop the spans that have
-- ended, and answer the totals (usage.go). The scripts of the transitions count nothing
-- in Redis: each answers what it moved (lua/prelude.lua, ACCT), the daemon adds that up
-- and sends it here, for a tenant, at most every usageFlushEvery and before its own reads.
--
-- KEYS[1]  the tenant's totals (usageTotalsKey): a hash of r (records) and b (bytes),
--          and for each span that counts something, field k (in decimal), its records
--          and bytes as bytes * BYTE + records
-- KEYS[2]  the spans of KEYS[1] (usageEndsKey): a sorted set, each span scored by itself
-- KEYS[3]  optional: the tenant's one usage hash of the earlier release (on a Redis
--          without Cluster), whose spans are folded in and which is then deleted
-- ARGV     triples span, records, bytes: what daemons moved since they last sent
--
-- A span k counts the records that expire in ((k-1)*SPAN, k*SPAN] and still counts
-- while k*SPAN has not passed by Redis's clock; once it has, its records have expired
-- (silently, by Redis), and the span is taken away from r and b. So whatever a span
-- holds, right or wrong (a daemon that died before sending what it counted, or sent it
-- twice), leaves the totals when the span ends: the totals can be wrong by what was lost
-- for no longer than the records concerned live.
--
-- READONLY (set by usage.go for the second form of the script) answers the totals less
-- the spans that have ended, writing nothing, on a Redis that refuses writes (out of
-- memory); it takes no ARGV.
--
-- Answers {records, bytes, the earliest span that counts (0 for none)}.
local TOTALS, ENDS, OLD = KEYS[1], KEYS[2], KEYS[3]
local SPAN, BYTE = 10000, 16777216
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The first span that still counts.
local live = math.ceil(now / SPAN)

-- split reads a span's records and bytes: records between -BYTE/2 and BYTE/2, so that a
-- span that lost more than it was given (a record counted before a daemon died and
-- taken away after) reads as the negative figures it holds.
local function split(v)
  local rec = v % BYTE
  if rec >= BYTE / 2 then
    rec = rec - BYTE
  end
  return rec, (v - rec) / BYTE
end

-- What is to be added, span by span, from ARGV and from the earlier release's hash.
local add, spans = {}, {}
local dr, db = 0, 0
local function take(span, rec, bytes)
  if span < live or (rec == 0 and bytes == 0) then
    return
  end
  local a = add[span]
  if not a then
    a = {0, 0}
    add[span] = a
    spans[#spans + 1] = span
  end
  a[1], a[2] = a[1] + rec, a[2] + bytes
  dr, db = dr + rec, db + bytes
end
if not READONLY then
  for i = 1, #ARGV, 3 do
    take(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  end
end
local old = nil
if OLD and not READONLY then
  old = redis.call('HGETALL', OLD)
  for i = 1, #old, 2 do
    local span, v = tonumber(old[i]), tonumber(old[i + 1])
    if span and v then
      take(span, split(v))
    end
  end
end

-- The spans that have ended, a batch at a time: a Lua unpack takes a few thousand.
local r = tonumber(redis.call('HGET', TOTALS, 'r') or '0')
local b = tonumber(redis.call('HGET', TOTALS, 'b') or '0')
local ended = {}
local from = '-inf'
while true do
  local batch = redis.call('ZRANGEBYSCORE', ENDS, from, '(' .. live, 'LIMIT', 0, 2000)
  if #batch == 0 then
    break
  end
  local vals = redis.call('HMGET', TOTALS, unpack(batch))
  for i = 1, #batch do
    if vals[i] then
      local rec, bytes = split(tonumber(vals[i]))
      dr, db = dr - rec, db - bytes
    end
  end
  ended[#ended + 1] = batch
  if #batch < 2000 then
    break
  end
  from = '(' .. batch[#batch]
end

if READONLY then
  r, b = r + dr, b + db
else
  -- The totals move first, so that a Redis refusing the write (out of memory) refuses
  -- it before the script has changed anything.
  if dr ~= 0 then
    r = redis.call('HINCRBY', TOTALS, 'r', dr)
  end
  if db ~= 0 then
    b = redis.call('HINCRBY', TOTALS, 'b', db)
  end
  for i = 1, #ended do
    redis.call('HDEL', TOTALS, unpack(ended[i]))
    redis.call('ZREM', ENDS, unpack(ended[i]))
  end
  for i = 1, #spans do
    local span = spans[i]
    local a = add[span]
    local by = a[2] * BYTE + a[1]
    if by ~= 0 then
      -- A span's field is in ENDS while it exists, and exists while it is not 0: a
      -- field that holds just what was added is new.
      local v = redis.call('HINCRBY', TOTALS, span, by)
      if v == 0 then
        redis.call('HDEL', TOTALS, span)
        redis.call('ZREM', ENDS, span)
      elseif v == by then
        redis.call('ZADD', ENDS, span, span)
      end
    end
  end
  if old and #old > 0 then
    redis.call('DEL', OLD)
  end
end

local first = redis.call('ZRANGEBYSCORE', ENDS, live, '+inf', 'LIMIT', 0, 1)
return {r, b, tonumber(first[1] or '0')}
