-- release: give a held key back for a retry, or record a terminal failure.
-- KEYS[1] the record
-- ARGV[1] lease token   ARGV[2] mode: retry or fail
-- ARGV[3] response status ('' for none)   ARGV[4] response headers, JSON
-- ARGV[5] response body   ARGV[6] retention, ms
-- Answers ok, not_found or lease_lost. The same release repeated is ok.
local key = KEYS[1]
local token, mode = ARGV[1], ARGV[2]
local now = now_ms()

local cur = redis.call('HMGET', key, 'st', 'tok')
local st, tok = cur[1], cur[2]
if not st then
  return reply('not_found', now, key, false)
end
if tok ~= token then
  return reply('lease_lost', now, key, false)
end
if (st == 'r' and mode == 'retry') or (st == 'f' and mode == 'fail') then
  return reply('ok', now, key, false)
end
if st ~= 'p' then
  return reply('lease_lost', now, key, false)
end
local xa = now + tonumber(ARGV[6])
if mode == 'retry' then
  redis.call('HSET', key, 'st', 'r', 'lx', '0', 'ua', int(now), 'xa', int(xa))
else
  redis.call('HSET', key, 'st', 'f', 'rs', ARGV[3], 'rh', ARGV[4], 'rb', ARGV[5],
    'ua', int(now), 'xa', int(xa))
end
redis.call('PEXPIREAT', key, int(xa))
redis.call('PUBLISH', key, st)
return reply('ok', now, key, false)
