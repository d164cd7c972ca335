-- confirm: the key's record is in the new store (engine.Mover.ConfirmMoved): a moving
-- marker becomes a moved one, kept until ARGV[1] (ms), that keeps nothing of the
-- record. Anything else is left as it is.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- Answers {1, ACCT} when it confirmed (ACCT: what it moved in the usage, see
-- prelude.lua), 0 otherwise.
READ_MARKERS = true
local r = load()
if r.st ~= 'm' then
  return 0
end
local now = now_ms()
redis.call('DEL', LEGACY, LEAN)
account(r, nil)
save({k = r.k, t = r.t, st = 'x', at = 0, ca = now, ua = now, xa = tonumber(ARGV[1])})
return {1, ACCT}
