-- import: write a record of the record stream where the key holds no live record.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] the client's key ('' when the stream does not know it)   ARGV[2] tenant
-- ARGV[3] state (p, r, c or f)     ARGV[4] owner     ARGV[5] attempt
-- ARGV[6] lease expiry, ms ('' for none)   ARGV[7] '1' when recovered
-- ARGV[8] created, ms   ARGV[9] updated, ms   ARGV[10] expires, ms
-- ARGV[11] response status ('' for none)   ARGV[12] response body
-- ARGV[13] recovery point's name   ARGV[14] its data   ARGV[15] its attempt
-- ARGV[16] when it was recorded, ms ('' for no point)
-- ARGV[17..20] fingerprint, lease token, claim secret's SHA-256, headers as sent;
-- ARGV[21..24] the same as the lean layout keeps them (see prelude.lua)
-- Answers ok (written), exists (the record there, with its fields) or expired.
local function opt(v)
  if v == '' then
    return nil
  end
  return v
end
local function num(v)
  if v == '' then
    return nil
  end
  return tonumber(v)
end

local now = now_ms()
local cur = load()
if cur.st then
  return answer('exists', now, cur, false)
end
local xa = tonumber(ARGV[10])
if xa <= now then
  return answer('expired', now, {}, false)
end
local r = {k = opt(ARGV[1]), t = ARGV[2], st = ARGV[3], ow = opt(ARGV[4]), at = tonumber(ARGV[5]),
  lx = num(ARGV[6]), rec = ARGV[7], ca = tonumber(ARGV[8]), ua = tonumber(ARGV[9]), xa = xa,
  rs = num(ARGV[11]), rb = opt(ARGV[12]), pn = opt(ARGV[13]), pd = opt(ARGV[14]),
  pa = num(ARGV[15]), pt = num(ARGV[16]),
  fp = opt(form(ARGV[17], ARGV[21])), tok = form(ARGV[18], ARGV[22]),
  cs = opt(form(ARGV[19], ARGV[23])), rh = opt(form(ARGV[20], ARGV[24]))}
save(r)
if ARGV[1] ~= '' then
  index(r, ARGV[1])
end
return answer('ok', now, r, false)
