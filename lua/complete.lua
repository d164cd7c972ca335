-- complete: store the result of a held key.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] lease token   ARGV[2] response status   ARGV[3] response headers, JSON (''
-- from a daemon that writes lean records, which keep ARGV[7] only)
-- ARGV[4] response body   ARGV[5] retention, ms
-- ARGV[6], ARGV[7] the token and the headers as the lean layout keeps them
-- ARGV[8] the client's key
-- Answers ok, not_found or lease_lost. Completing again with the same token is ok and
-- keeps the first result.
local token = ARGV[1]
local now = now_ms()

local r = load()
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if not same(r.tok, token, ARGV[6]) then
  return answer('lease_lost', now, r, false)
end
if st == 'c' then
  return answer('ok', now, r, false)
end
if st ~= 'p' then
  return answer('lease_lost', now, r, false)
end
local xa = now + tonumber(ARGV[5])
-- The claim secret serves only while the key is pending.
r.st, r.rs, r.rh, r.rb, r.ua, r.xa, r.cs = 'c', ARGV[2], form(ARGV[3], ARGV[7]), ARGV[4], now, xa, nil
-- A finished key needs its recovery point no more.
r.pn, r.pd, r.pa, r.pt = nil, nil, nil, nil
save(r)
index(r, ARGV[8])
notify(r, 'c')
return answer('ok', now, r, false)
