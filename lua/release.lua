-- release: give a held key back for a retry, or record a terminal failure.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] lease token   ARGV[2] mode: retry or fail
-- ARGV[3] response status ('' for none)   ARGV[4] response headers, JSON ('' from a
-- daemon that writes lean records, which keep ARGV[8] only)
-- ARGV[5] response body   ARGV[6] retention, ms
-- ARGV[7], ARGV[8] the token and the headers as the lean layout keeps them
-- ARGV[9] the client's key
-- Answers ok, not_found or lease_lost. The same release repeated is ok.
local token, mode = ARGV[1], ARGV[2]
local now = now_ms()

local r = load()
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if not same(r.tok, token, ARGV[7]) then
  return answer('lease_lost', now, r, false)
end
if (st == 'r' and mode == 'retry') or (st == 'f' and mode == 'fail') then
  return answer('ok', now, r, false)
end
if st ~= 'p' then
  return answer('lease_lost', now, r, false)
end
local xa = now + tonumber(ARGV[6])
-- The claim secret serves only while the key is pending.
if mode == 'retry' then
  r.st, r.lx, r.ua, r.xa, r.cs = 'r', 0, now, xa, nil
else
  r.st, r.rs, r.rh, r.rb, r.ua, r.xa, r.cs = 'f', ARGV[3], form(ARGV[4], ARGV[8]), ARGV[5], now, xa, nil
  -- A finished key needs its recovery point no more; a key released for a retry keeps
  -- it for the next holder.
  r.pn, r.pd, r.pa, r.pt = nil, nil, nil, nil
end
save(r)
index(r, ARGV[9])
notify(r, st)
return answer('ok', now, r, false)
