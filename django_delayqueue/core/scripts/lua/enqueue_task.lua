-- enqueue_task: one task of Django's Tasks framework -> pending (or ready when already due),
-- and its result record, in one step: a result never exists without its message, nor a task
-- message without its result.
-- KEYS[1] pending zset   KEYS[2] ready list   KEYS[3] messages hash   KEYS[4] unack zset
-- KEYS[5] retry zset   KEYS[6] garbage zset   KEYS[7] the task's result record (hash)
-- KEYS[8] ranked zset   KEYS[9] priorities hash
-- KEYS[10] flow_keys hash   KEYS[11] key_turns zset   KEYS[12] key_waiting zset
-- KEYS[13] key_state hash   KEYS[14] key_tats zset   KEYS[15] key_lists prefix
-- KEYS[16] key_load zset
-- ARGV[1] now (ms)   ARGV[2] announce horizon (ms)   ARGV[3] wake channel
-- ARGV[4] id   ARGV[5] due (ms)   ARGV[6] envelope   ARGV[7] the record's enqueued field (JSON)
-- ARGV[8] priority (-100..100)
-- returns: as schedule.lua; the record is written only when the message was scheduled (an id
-- taken already keeps the record it has, and its priority). See includes/task_enqueue.lua.
local pending, ready, messages, unack = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retry, garbage, record, ranked = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local priorities, flow_keys, key_turns, key_waiting = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_state, key_tats, key_lists, key_load = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
--- @include "includes/task_enqueue.lua"
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
return enqueue_task(
  pending, ready, messages, unack, retry, garbage, record, ranked, priorities, ARGV[7],
  tonumber(ARGV[8]), K
)
