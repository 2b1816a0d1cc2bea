-- enqueue_task: one task of Django's Tasks framework -> pending (or ready when already due),
-- and its result record, in one step: a result never exists without its message, nor a task
-- message without its result.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] the task's result record (string)
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] id   ARGV[5] due (ms)   ARGV[6] envelope   ARGV[7] result record (JSON)
-- returns: as schedule.lua; the record is written only when the message was scheduled (an id
-- taken already keeps the record it has).
--- @include "includes/scheduling.lua"
guard(KEYS[7], 'string')
local out = schedule_triples(4, 6)
if out[1] == 1 then redis.call('SET', KEYS[7], ARGV[7]) end
return out
