-- purge: delete a record, waking anyone waiting on it.
-- KEYS[1] the record
-- Answers ok or not_found.
local key = KEYS[1]
local now = now_ms()
local r = load(key)
if not r.st then
  return answer('not_found', now, {}, false)
end
redis.call('DEL', key)
notify(key, r, 'd')
return answer('ok', now, {}, false)
