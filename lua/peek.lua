#!lua flags=no-writes
-- peek: what a live move's copier needs of a key: its state (a marker's too) and the
-- client's key where the record keeps it.
-- KEYS[1], KEYS[2] the record's keys (see prelude.lua)
-- Answers {st, k} ('' for none).
READ_MARKERS = true
local r = load()
return {r.st or '', r.k or ''}
