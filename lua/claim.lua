-- claim: acquire a key, replay its result, or report who holds it.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- ARGV[1] lease token chosen by the daemon for this claim
-- ARGV[2] fingerprint ('' for none)   ARGV[3] owner ('' for none)
-- ARGV[4] lease, ms                   ARGV[5] retention of a pending record, ms
-- ARGV[6] the client's key            ARGV[7] tenant
-- ARGV[8] SHA-256 of the claim secret ('' for none)
-- ARGV[9] '1' when the caller waits for a live holder (marks the record, so that its
--         changes are published)
-- ARGV[10], ARGV[11], ARGV[12] the token, the fingerprint and the secret's SHA-256 as
--         the lean layout keeps them (see prelude.lua)
-- Answers acquired, completed, failed, in_progress or mismatch.
local token, fp, owner = ARGV[1], ARGV[2], ARGV[3]
local lease, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local secret = ARGV[8] or ''
local ctoken, cfp, csecret = ARGV[10], ARGV[11], ARGV[12]
local now = now_ms()

local r = load()
local st = r.st
if not st then
  local xa = now + math.max(retention, lease)
  r = {k = ARGV[6], t = ARGV[7], st = 'p', fp = form(fp, cfp), ow = owner,
    cs = form(secret, csecret), at = 1, tok = form(token, ctoken), lx = now + lease,
    rec = '0', ca = now, ua = now, xa = xa}
  save(r)
  index(r, ARGV[6])
  return answer('acquired', now, r, false)
end

local sfp, stok, slx, scs = r.fp or '', r.tok or '', tonumber(r.lx or '0'), r.cs or ''

-- The same claim run again (a resent command) finds its own token and answers as before.
if st == 'p' and same(stok, token, ctoken) then
  return answer('acquired', now, r, false)
end
-- Fingerprints compare exactly: no fingerprint is one of its own, not a wildcard.
if not same(sfp, fp, cfp) then
  return answer('mismatch', now, r, false)
end
if st == 'c' then
  return answer('completed', now, r, true)
end
if st == 'f' then
  return answer('failed', now, r, true)
end
if st == 'p' and slx > now then
  if secret ~= '' and same(scs, secret, csecret) then
    return answer('acquired', now, r, false)
  end
  if ARGV[9] == '1' and r.w ~= '1' then
    r.w = '1'
    save(r)
  end
  return answer('in_progress', now, r, false)
end

-- Released for a retry, or pending under an expired lease: take it.
local recovered = '0'
if st == 'p' then
  recovered = '1'
end
local xa = math.max(tonumber(r.xa or '0'), now + math.max(retention, lease))
r.st, r.ow, r.cs = 'p', owner, form(secret, csecret)
r.at, r.tok = tonumber(r.at) + 1, form(token, ctoken)
r.lx, r.rec, r.ua, r.xa = now + lease, recovered, now, xa
save(r)
index(r, ARGV[6])
return answer('acquired', now, r, false)
