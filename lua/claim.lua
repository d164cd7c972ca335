-- claim: acquire a key, replay its result, or report who holds it.
-- KEYS[1] the record
-- ARGV[1] lease token chosen by the daemon for this claim
-- ARGV[2] fingerprint ('' for none)   ARGV[3] owner ('' for none)
-- ARGV[4] lease, ms                   ARGV[5] retention of a pending record, ms
-- ARGV[6] the client's key            ARGV[7] tenant
-- ARGV[8] SHA-256 of the claim secret ('' for none)
-- Answers acquired, completed, failed, in_progress or mismatch.
local key = KEYS[1]
local token, fp, owner = ARGV[1], ARGV[2], ARGV[3]
local lease, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local secret = ARGV[8]
local now = now_ms()

local st = redis.call('HGET', key, 'st')
if not st then
  local xa = now + math.max(retention, lease)
  redis.call('HSET', key, 'k', ARGV[6], 't', ARGV[7], 'st', 'p', 'fp', fp, 'ow', owner,
    'cs', secret, 'at', '1', 'tok', token, 'lx', int(now + lease), 'rec', '0',
    'ca', int(now), 'ua', int(now), 'xa', int(xa))
  redis.call('PEXPIREAT', key, int(xa))
  return reply('acquired', now, key, false)
end

local cur = redis.call('HMGET', key, 'fp', 'tok', 'lx', 'cs', 'at', 'xa')
local sfp, stok, slx, scs = cur[1] or '', cur[2] or '', tonumber(cur[3] or '0'), cur[4] or ''

-- The same claim run again (a resent command) finds its own token and answers as before.
if st == 'p' and stok == token then
  return reply('acquired', now, key, false)
end
-- Fingerprints compare exactly: no fingerprint is one of its own, not a wildcard.
if sfp ~= fp then
  return reply('mismatch', now, key, false)
end
if st == 'c' then
  return reply('completed', now, key, true)
end
if st == 'f' then
  return reply('failed', now, key, true)
end
if st == 'p' and slx > now then
  if secret ~= '' and secret == scs then
    return reply('acquired', now, key, false)
  end
  return reply('in_progress', now, key, false)
end

-- Released for a retry, or pending under an expired lease: take it.
local recovered = '0'
if st == 'p' then
  recovered = '1'
end
local xa = math.max(tonumber(cur[6] or '0'), now + math.max(retention, lease))
redis.call('HSET', key, 'st', 'p', 'ow', owner, 'cs', secret, 'at', int(tonumber(cur[5]) + 1),
  'tok', token, 'lx', int(now + lease), 'rec', recovered, 'ua', int(now), 'xa', int(xa))
redis.call('PEXPIREAT', key, int(xa))
return reply('acquired', now, key, false)
