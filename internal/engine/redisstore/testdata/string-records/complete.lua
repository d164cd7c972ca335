-- complete: store the result of a held key.
-- KEYS[1] the record
-- ARGV[1] lease token   ARGV[2] response status   ARGV[3] response headers, JSON
-- ARGV[4] response body   ARGV[5] retention, ms
-- Answers ok, not_found or lease_lost. Completing again with the same token is ok and
-- keeps the first result.
local key = KEYS[1]
local token = ARGV[1]
local now = now_ms()

local r = load(key)
local st = r.st
if not st then
  return answer('not_found', now, r, false)
end
if r.tok ~= token then
  return answer('lease_lost', now, r, false)
end
if st == 'c' then
  return answer('ok', now, r, false)
end
if st ~= 'p' then
  return answer('lease_lost', now, r, false)
end
local xa = now + tonumber(ARGV[5])
r.st, r.rs, r.rh, r.rb, r.ua, r.xa = 'c', ARGV[2], ARGV[3], ARGV[4], now, xa
save(key, r)
notify(key, r, 'c')
return answer('ok', now, r, false)
