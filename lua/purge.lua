-- purge: delete a record, waking anyone waiting on it.
-- KEYS[1] the record
-- Answers ok or not_found.
local key = KEYS[1]
local now = now_ms()
if redis.call('DEL', key) == 0 then
  return reply('not_found', now, key, false)
end
redis.call('PUBLISH', key, 'd')
return reply('ok', now, key, false)
