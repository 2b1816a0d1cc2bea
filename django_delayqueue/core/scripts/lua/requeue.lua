-- requeue: dead letters (garbage) -> ready, with a fresh set of attempts.
-- KEYS[1] garbage zset   KEYS[2] ready list   KEYS[3] attempts hash   KEYS[4] tokens hash
-- KEYS[5] reasons hash   KEYS[6] ready_since hash   KEYS[7] ranked zset
-- KEYS[8] priorities hash
-- KEYS[9] flow_keys hash   KEYS[10] key_turns zset   KEYS[11] key_waiting zset
-- KEYS[12] key_state hash   KEYS[13] key_tats zset   KEYS[14] key_lists prefix
-- KEYS[15] key_load zset
-- KEYS[16..] the result record of each id (a task's; any type)
-- ARGV[1] now (ms)   ARGV[2] wake channel   ARGV[3..] ids
-- returns: {requeued, dead letters left}
-- They are overdue from now (recorded in ready_since), not from the due time in the envelope.
-- A requeued task's record loses the expiry its FAILED end gave it: it may wait and run for
-- longer than that, and its record must be there when it ends (its next end sets a new one).
-- The ids are always given (the caller lists the oldest dead letters to requeue them all), so
-- that each one's record arrives through KEYS.
local garbage, ready, attempts, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local reasons, ready_since, ranked, priorities = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local flow_keys, key_turns, key_waiting, key_state = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_tats, key_lists, key_load = KEYS[13], KEYS[14], KEYS[15]
local records = {}
for i = 16, #KEYS do records[i - 15] = KEYS[i] end
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
guard(
  garbage, 'zset', ready, 'list', attempts, 'hash', tokens, 'hash', reasons, 'hash',
  ready_since, 'hash', ranked, 'zset', priorities, 'hash'
)
if redis.call('HLEN', flow_keys) > 0 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
end
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', garbage, id) == 1 then
    back_to_ready(ready, ranked, priorities, tokens, ready_since, id, ARGV[1], K)
    redis.call('HDEL', attempts, id)  -- a fresh set of attempts
    redis.call('HDEL', reasons, id)  -- and no reason: it is not dead any more
    redis.call('PERSIST', records[i - 2])
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return {n, redis.call('ZCARD', garbage)}
