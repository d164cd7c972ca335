-- moveout: hand a key over to another store, in a live move (engine.Mover.MoveOut).
-- KEYS[1], KEYS[2], KEYS[3] the record's keys (see prelude.lua)
-- ARGV[1] until when the marker is kept, ms   ARGV[2] the client's key ('' when
-- unknown)   ARGV[3] tenant   ARGV[4] '1' to seal a key with no live record
-- A live record becomes a moving marker that keeps it (its state in ms, its expiry in
-- mx), its pending entry goes and its waiters are woken, and it is answered as export
-- answers it; a moving marker answers the record it keeps. A moved marker stays, and a
-- key with no live record becomes one when ARGV[4] is '1' (is left as it is
-- otherwise): answers {'moved', now_ms}. Where it wrote, the answer ends with what it
-- moved in the usage (ACCT, see prelude.lua): {'moved', now_ms, ACCT}, or the export's
-- 22 fields and ACCT.
READ_MARKERS = true
local now = now_ms()
local r = load()
local until_ms = tonumber(ARGV[1])
local function copy(c)
  return {'ok', now, c.k or '', c.t or '', c.st, c.fp or '', c.ow or '', c.at or '',
    c.tok or '', c.lx or '', c.rec or '', c.ca or '', c.ua or '', c.xa or '', c.rs or '',
    c.rh or '', c.rb or '', c.cs or '', c.pn or '', c.pd or '', c.pa or '', c.pt or ''}
end
if not r.st and ARGV[4] ~= '1' then
  return {'moved', now}
end
if not r.st then
  local k = nil
  if ARGV[2] ~= '' then
    k = ARGV[2]
  end
  save({k = k, t = ARGV[3], st = 'x', at = 0, ca = now, ua = now, xa = until_ms})
  return {'moved', now, ACCT}
end
if r.st == 'x' then
  return {'moved', now}
end
if r.st == 'm' then
  r.st, r.xa = r.ms, r.mx
  return copy(r)
end
if r.st ~= 'p' and r.st ~= 'c' and r.st ~= 'r' and r.st ~= 'f' then
  error({err = 'STOREMOVED the record of ' .. LEGACY .. ' is in a state this release does not know'})
end
local answer_now = copy(r)
local key = r.k or ARGV[2]
if key and key ~= '' then
  redis.call('ZREM', INDEX, key)
end
notify(r, 'm')
r.ms, r.mx = r.st, tonumber(r.xa)
r.st, r.xa = 'm', until_ms
save(r)
answer_now[23] = ACCT
return answer_now
