-- dead_letters_with_reason: the ids of the newest dead letters that died of one reason (the
-- admin's "requeue all" and "purge all" of a group).
-- KEYS[1] garbage zset   KEYS[2] reasons hash
-- ARGV[1] most (how many of the newest dead letters are looked at)   ARGV[2] reason
-- returns: the ids, newest first
-- Reads only: the caller requeues or purges them (requeue.lua, purge.lua skip an id that left
-- the dead letters meanwhile). A dead letter with no reason has the reason ''.
local garbage, reasons = KEYS[1], KEYS[2]
local most, wanted = tonumber(ARGV[1]), ARGV[2]
local ids = {}
for _, id in ipairs(redis.call('ZREVRANGE', garbage, 0, most - 1)) do
  if (redis.call('HGET', reasons, id) or '') == wanted then ids[#ids + 1] = id end
end
return ids
