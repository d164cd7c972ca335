-- complete: store the result of a held key.
-- KEYS[1] the record
-- ARGV[1] lease token   ARGV[2] response status   ARGV[3] response headers, JSON
-- ARGV[4] response body   ARGV[5] retention, ms
-- Answers ok, not_found or lease_lost. Completing again with the same token is ok and
-- keeps the first result.
local key = KEYS[1]
local token = ARGV[1]
local now = now_ms()

local cur = redis.call('HMGET', key, 'st', 'tok')
local st, tok = cur[1], cur[2]
if not st then
  return reply('not_found', now, key, false)
end
if tok ~= token then
  return reply('lease_lost', now, key, false)
end
if st == 'c' then
  return reply('ok', now, key, false)
end
if st ~= 'p' then
  return reply('lease_lost', now, key, false)
end
local xa = now + tonumber(ARGV[5])
redis.call('HSET', key, 'st', 'c', 'rs', ARGV[2], 'rh', ARGV[3], 'rb', ARGV[4],
  'ua', int(now), 'xa', int(xa))
redis.call('PEXPIREAT', key, int(xa))
redis.call('PUBLISH', key, 'c')
return reply('ok', now, key, false)
