-- usagefold: take the usage hash that a daemon of the earlier release wrote in one
-- Cluster slot for a tenant (usage.go, foldEarlier): answers its fields and values, as
-- HGETALL does, and deletes it, so that the spans it held are folded into the tenant's
-- totals once.
-- KEYS[1]  the tenant's usage hash of that slot ({tag}\0usage:<tenant>)
local v = redis.call('HGETALL', KEYS[1])
if #v > 0 then
  redis.call('DEL', KEYS[1])
end
return v
