-- extend: renew a held lease.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] lease token   ARGV[2] lease, ms
-- ARGV[3] the token as the lean layout keeps it   ARGV[4] the client's key
-- Answers ok, not_found or lease_lost. A lease that ran out may still be extended while
-- nobody has taken the key over: the token, not the clock, decides.
local token = ARGV[1]
local now = now_ms()

local r = load()
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if st ~= 'p' or not same(r.tok, token, ARGV[3]) then
  return answer('lease_lost', now, r, false)
end
local lx = now + tonumber(ARGV[2])
local xa = math.max(tonumber(r.xa or '0'), lx)
r.lx, r.xa = lx, xa
save(r)
index(r, ARGV[4])
return answer('ok', now, r, false)
