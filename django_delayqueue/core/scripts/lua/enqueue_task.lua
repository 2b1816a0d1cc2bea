-- enqueue_task: one task of Django's Tasks framework -> pending (or ready when already due),
-- and its result record, in one step: a result never exists without its message, nor a task
-- message without its result.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] the task's result record (hash)
-- KEYS[8] ranked zset   KEYS[9] priorities hash
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] id   ARGV[5] due (ms)   ARGV[6] envelope   ARGV[7] the record's enqueued field (JSON)
-- ARGV[8] priority (-100..100)
-- returns: as schedule.lua; the record is written only when the message was scheduled (an id
-- taken already keeps the record it has, and its priority).
-- A priority other than 0 is kept in the priorities hash; a task due now then moves from the
-- tail of the ready list, where schedule_triples put it, to its place in the ranked zset.
--- @include "includes/scheduling.lua"
--- @include "includes/ready_list.lua"
guard(KEYS[7], 'hash', KEYS[8], 'zset', KEYS[9], 'hash')
local out = schedule_triples(4, 6)
local priority = tonumber(ARGV[8])
if out[1] == 1 then
  redis.call('HSET', KEYS[7], 'enqueued', ARGV[7], 'status', 'READY')
  if priority ~= 0 then
    redis.call('HSET', KEYS[9], ARGV[4], priority)
    redis.call('HSETNX', KEYS[9], RANK_ORDER, 0)
    -- Due now: at the list's tail (whose type schedule_triples checked only in that case).
    if tonumber(ARGV[5]) <= tonumber(ARGV[1]) and redis.call('LINDEX', KEYS[2], -1) == ARGV[4] then
      redis.call('RPOP', KEYS[2])
      to_ready(KEYS[2], KEYS[8], KEYS[9], {ARGV[4]}, false)
    end
  end
end
return out
