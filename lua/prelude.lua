-- Shared by every transition script: idemd prepends this file to each script when it
-- loads them, so each script still runs as one EVALSHA on one key.
--
-- A record is one hash. Fields:
--   k   the client's key          t   tenant          st  state: p, r, c or f
--   fp  fingerprint               ow  owner           at  attempt
--   tok current (or last) lease token                 lx  lease expiry, ms
--   rec 1 when the lease was taken over after expiry
--   cs  SHA-256 of the current lease's claim secret (never part of an answer)
--   ca  created, ms   ua  updated, ms   xa  when the record expires, ms
--   rs  response status   rh  response headers, JSON   rb  response body, raw bytes
--
-- Every script answers {status, now_ms, <META fields...>[, rs, rh, rb]}.
local META = {'k', 't', 'st', 'fp', 'ow', 'at', 'tok', 'lx', 'rec', 'ca', 'ua', 'xa'}

-- Time comes from Redis, never from a daemon, so that daemons with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers as decimal strings: Lua's own number formatting switches to exponent form.
local function int(n)
  return string.format('%.0f', n)
end

local function reply(status, now, key, with_response)
  local out = {status, int(now)}
  local vals = redis.call('HMGET', key, unpack(META))
  for i = 1, #vals do
    out[#out + 1] = vals[i] or ''
  end
  if with_response then
    local r = redis.call('HMGET', key, 'rs', 'rh', 'rb')
    for i = 1, 3 do
      out[#out + 1] = r[i] or ''
    end
  end
  return out
end
