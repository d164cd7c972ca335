#!lua flags=no-writes
-- lookup: read a record. Marked no-writes so that it runs while Redis is out of memory
-- and on a replica.
-- KEYS[1] the record
-- Answers ok or not_found.
local key = KEYS[1]
local now = now_ms()
if redis.call('EXISTS', key) == 0 then
  return reply('not_found', now, key, false)
end
return reply('ok', now, key, true)
