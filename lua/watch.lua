-- watch: mark a record as watched, so that its changes are published from now on.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- Answers 1 when the record exists, 0 otherwise; {1, ACCT} when marking it moved its
-- usage (see prelude.lua). A record created later is marked by
-- the first claim that waits on it (claim.lua, ARGV[9]).
local r = load()
if not r.st then
  return 0
end
if r.w ~= '1' then
  r.w = '1'
  save(r)
  return {1, ACCT}
end
return 1
