-- release: give a held key back for a retry, or record a terminal failure.
-- KEYS[1] the record
-- ARGV[1] lease token   ARGV[2] mode: retry or fail
-- ARGV[3] response status ('' for none)   ARGV[4] response headers, JSON
-- ARGV[5] response body   ARGV[6] retention, ms
-- Answers ok, not_found or lease_lost. The same release repeated is ok.
local key = KEYS[1]
local token, mode = ARGV[1], ARGV[2]
local now = now_ms()

local r = load(key)
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if r.tok ~= token then
  return answer('lease_lost', now, r, false)
end
if (st == 'r' and mode == 'retry') or (st == 'f' and mode == 'fail') then
  return answer('ok', now, r, false)
end
if st ~= 'p' then
  return answer('lease_lost', now, r, false)
end
local xa = now + tonumber(ARGV[6])
if mode == 'retry' then
  r.st, r.lx, r.ua, r.xa = 'r', 0, now, xa
else
  r.st, r.rs, r.rh, r.rb, r.ua, r.xa = 'f', ARGV[3], ARGV[4], ARGV[5], now, xa
end
save(key, r)
notify(key, r, st)
return answer('ok', now, r, false)
