#!lua flags=no-writes
-- export: read a record whole, as the record stream carries it.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- Answers {'ok', now_ms, k, t, st, fp, ow, at, tok, lx, rec, ca, ua, xa, rs, rh, rb, cs,
-- pn, pd, pa, pt} ('' for none), or {'not_found', now_ms}.
local now = now_ms()
local r = load()
if not r.st or tonumber(r.xa or '0') < now then
  return {'not_found', now}
end
return {'ok', now, r.k or '', r.t or '', r.st, r.fp or '', r.ow or '', r.at or '',
  r.tok or '', r.lx or '', r.rec or '', r.ca or '', r.ua or '', r.xa or '', r.rs or '',
  r.rh or '', r.rb or '', r.cs or '', r.pn or '', r.pd or '', r.pa or '', r.pt or ''}
