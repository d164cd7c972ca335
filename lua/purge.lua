-- purge: delete a record, waking anyone waiting on it.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] the client's key
-- Answers ok or not_found.
local now = now_ms()
local r = load()
if not r.st then
  return answer('not_found', now, {}, false)
end
redis.call('DEL', LEAN, LEGACY)
redis.call('ZREM', INDEX, ARGV[1])
account(r, nil)
notify(r, 'd')
return answer('ok', now, {}, false)
