-- write_record: fields of one record hash (a task's result) set, and its expiry.
-- KEYS[1] the record (hash)
-- ARGV[1] seconds it is kept from this write on (0: no expiry, the task is not finished)
-- ARGV[2] this write's order: the 'order' field keeps the highest written
-- ARGV[3] the fields, JSON of four lists of strings: [absent, in_order, deleted, always], the
--   pairs (field, value, ...) set only where the field is absent, the pairs set and the fields
--   deleted only if this write's order is not below the record's, the pairs set whatever the
--   order. One argument, not one per field: the consumer that sends it encodes every argument
--   of its pipeline in Python, and a task's write has a dozen.
-- ARGV[4] (optional) a field the record must have: when it has not (a record deleted by hand,
--   or expired and its task requeued), nothing is written and -1 returned, so that the caller
--   writes it whole. A task's end leaves out its record's 'enqueued' so (the JSON of the
--   task's arguments, in the record since enqueue), instead of encoding and sending it again.
-- returns: 1 (0 when a later write already landed: the in-order part was left; -1 when the
--   record lacks ARGV[4]: nothing written)
-- Sent with a consumer's round trip (a delivery's ack, or the next one), so that a handler
-- that leaves it (django_delayqueue.tasks.runner) pays no round trip of its own for it; the
-- order makes writes that land late harmless (a RUNNING sent after the attempt's READY).
-- The expiry goes with the status: a late write of an older attempt must not start the clock
-- of a record whose latest attempt still runs, and a write in order that is not final (a
-- requeued task running again, or READY for a retry) takes back the expiry and finished_at
-- an earlier end left, so a record never expires while its task may still run.
-- Runs when Redis is out of memory (see includes/memory.lua): a task's result goes with the
-- ack that frees its message, and must not be lost because the server is full.
--- @include "includes/guard.lua"
--- @include "includes/memory.lua"
-- One read (the order and the fields set where absent) and one HSET of everything this write
-- sets: a task's delivery costs Redis a handful of commands, not one per field. The read
-- proves the key's type before any write (guard() only words the error when it is wrong).
local ttl, order = tonumber(ARGV[1]), tonumber(ARGV[2])
local fields = cjson.decode(ARGV[3])
local absent, ordered, deleted, always = fields[1], fields[2], fields[3], fields[4]
local wanted = {'order'}
for i = 1, #absent, 2 do wanted[#wanted + 1] = absent[i] end
local required = ARGV[4]
if required then wanted[#wanted + 1] = required end
local stored = redis.pcall('HMGET', KEYS[1], unpack(wanted))
if stored.err then
  guard(KEYS[1], 'hash')
  return redis.error_reply(stored.err)
end
if required and not stored[#wanted] then return -1 end
local in_order = order >= (tonumber(stored[1]) or -1)
local set = {}
for i = 1, #absent, 2 do
  if not stored[(i + 1) / 2 + 1] then set[#set + 1] = absent[i]; set[#set + 1] = absent[i + 1] end
end
if in_order then
  set[#set + 1] = 'order'
  set[#set + 1] = ARGV[2]
  for i = 1, #ordered do set[#set + 1] = ordered[i] end
end
for i = 1, #always do set[#set + 1] = always[i] end
allow_oom(KEYS[1], 'hash')
if #set > 0 then redis.call('HSET', KEYS[1], unpack(set)) end
if in_order then
  if #deleted > 0 then redis.call('HDEL', KEYS[1], unpack(deleted)) end
  if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
end
return in_order and 1 or 0
