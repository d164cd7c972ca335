-- extend: renew a held lease.
-- KEYS[1] the record
-- ARGV[1] lease token   ARGV[2] lease, ms
-- Answers ok, not_found or lease_lost. A lease that ran out may still be extended while
-- nobody has taken the key over: the token, not the clock, decides.
local key = KEYS[1]
local token = ARGV[1]
local now = now_ms()

local r = load(key)
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if st ~= 'p' or r.tok ~= token then
  return answer('lease_lost', now, r, false)
end
local lx = now + tonumber(ARGV[2])
local xa = math.max(tonumber(r.xa or '0'), lx)
r.lx, r.xa = lx, xa
save(key, r)
return answer('ok', now, r, false)
