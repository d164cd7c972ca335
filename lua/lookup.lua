#!lua flags=no-writes
-- lookup: read a record. Marked no-writes so that it runs while Redis is out of memory
-- and on a replica.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- Answers ok or not_found.
local now = now_ms()
local r = load()
if not r.st then
  return answer('not_found', now, r, false)
end
return answer('ok', now, r, true)
