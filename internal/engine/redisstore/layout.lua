-- The layout key: the record layout the daemons of this Redis use (layout.go). It only
-- ever moves forward along the upgrade's steps, so that no daemon can take the Redis
-- back to a layout that the daemons already running would not read.
--
-- KEYS[1]  the layout key (LayoutKey)
-- ARGV[1]  a layout: hashes, strings, lean-ready, lean or lean-only
-- ARGV[2]  'read' writes nothing; 'absent' writes ARGV[1] where the key holds nothing;
--          'forward' also replaces a layout of an earlier step (never one this script
--          does not know, which a later release may have written)
--
-- Answers the key's value before and after, false for none.
local steps = {hashes = 1, strings = 2, ['lean-ready'] = 3, lean = 4, ['lean-only'] = 5}
local before = redis.call('GET', KEYS[1])
local after = before
if ARGV[2] ~= 'read' and (not before or (ARGV[2] == 'forward' and steps[before] and steps[before] < steps[ARGV[1]])) then
  redis.call('SET', KEYS[1], ARGV[1])
  after = ARGV[1]
end
return {before, after}
