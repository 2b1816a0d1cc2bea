-- write_record: fields of one record hash (a task's result) set, and its expiry.
-- KEYS[1] the record (hash)
-- ARGV[1] seconds it is kept from now on (0: the expiry it has)
-- ARGV[2] this write's order: the 'order' field keeps the highest written
-- ARGV[3] how many pairs are set only where the field is absent
-- ARGV[4] how many pairs are set only if this write's order is not below the record's
-- ARGV[5..] pairs: field, value (those set where absent, those set in order, the others)
-- returns: 1 (0 when the ordered pairs were left: a later write already landed)
-- Sent with a consumer's round trip (a delivery's ack, or the next one), so that a handler
-- that leaves it (django_delayqueue.tasks.runner) pays no round trip of its own for it; the
-- order makes writes that land late harmless (a RUNNING sent after the attempt's READY).
--- @include "includes/guard.lua"
guard(KEYS[1], 'hash')
local order, absent, ordered = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local first_ordered, first_plain = 5 + 2 * absent, 5 + 2 * (absent + ordered)
for i = 5, first_ordered - 1, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
local in_order = order >= (tonumber(redis.call('HGET', KEYS[1], 'order')) or -1)
if in_order and ordered > 0 then
  redis.call('HSET', KEYS[1], 'order', ARGV[2], unpack(ARGV, first_ordered, first_plain - 1))
end
if #ARGV >= first_plain then redis.call('HSET', KEYS[1], unpack(ARGV, first_plain)) end
if tonumber(ARGV[1]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return in_order and 1 or 0
