#!lua flags=no-writes
-- lookup: read a record. Marked no-writes so that it runs while Redis is out of memory
-- and on a replica.
-- KEYS[1] the record
-- Answers ok or not_found.
local key = KEYS[1]
local now = now_ms()
local r = load(key)
if not r.st then
  return answer('not_found', now, r, false)
end
return answer('ok', now, r, true)
