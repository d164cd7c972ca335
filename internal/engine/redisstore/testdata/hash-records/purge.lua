-- purge: delete a record, waking anyone waiting on it.
-- KEYS[1] the record
-- Answers ok or not_found.
local key = KEYS[1]
local now = now_ms()
local w = redis.call('HGET', key, 'w')
if redis.call('DEL', key) == 0 then
  return answer('not_found', now, {}, false)
end
notify(key, {w = w}, 'd')
return answer('ok', now, {}, false)
