-- mark: record a recovery point under a held lease, over the one recorded before.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] lease token   ARGV[2] the point's name   ARGV[3] its data
-- ARGV[4] the token as the lean layout keeps it
-- Answers ok, not_found or lease_lost. As for extend, the token decides, not the clock.
-- The lease is left as it was, and nobody is notified: waiters wait for the lease.
local token = ARGV[1]
local now = now_ms()

local r = load()
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if st ~= 'p' or not same(r.tok, token, ARGV[4]) then
  return answer('lease_lost', now, r, false)
end
r.pn, r.pd, r.pa, r.pt, r.ua = ARGV[2], ARGV[3], tonumber(r.at), now, now
save(r)
return answer('ok', now, r, false)
