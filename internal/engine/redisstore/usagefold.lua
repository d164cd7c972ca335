-- usagefold: take what a daemon of the release before this one counted of a tenant
-- (usage.go, foldEarlier), and delete it, so that it is folded into the tenant's totals
-- once: on a Cluster, the bitmap of the slots where it counted (a string: answered as
-- GET answers it), then the usage hash of each of those slots (answered as HGETALL
-- answers it). A key that is not there answers false.
-- KEYS[1]  \0usage-slots:<tenant>, or a slot's {tag}\0usage:<tenant>
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'string' then
  return redis.call('GETDEL', KEYS[1])
end
if kind ~= 'hash' then
  return false
end
local v = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return v
