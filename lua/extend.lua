-- extend: renew a held lease.
-- KEYS[1] the record
-- ARGV[1] lease token   ARGV[2] lease, ms
-- Answers ok, not_found or lease_lost. A lease that ran out may still be extended while
-- nobody has taken the key over: the token, not the clock, decides.
local key = KEYS[1]
local token = ARGV[1]
local now = now_ms()

local cur = redis.call('HMGET', key, 'st', 'tok', 'xa')
local st, tok = cur[1], cur[2]
if not st then
  return reply('not_found', now, key, false)
end
if st ~= 'p' or tok ~= token then
  return reply('lease_lost', now, key, false)
end
local lx = now + tonumber(ARGV[2])
local xa = math.max(tonumber(cur[3] or '0'), lx)
redis.call('HSET', key, 'lx', int(lx), 'xa', int(xa))
redis.call('PEXPIREAT', key, int(xa))
return reply('ok', now, key, false)
