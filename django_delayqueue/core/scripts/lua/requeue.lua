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
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash', KEYS[7], 'zset', KEYS[8], 'hash'
)
if redis.call('HLEN', KEYS[9]) > 0 then
  guard(KEYS[10], 'zset', KEYS[11], 'zset', KEYS[12], 'hash', KEYS[13], 'zset', KEYS[15], 'zset')
end
local K = keyed_keys(9)
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    back_to_ready(KEYS[2], KEYS[7], KEYS[8], KEYS[4], KEYS[6], id, ARGV[1], K)
    redis.call('HDEL', KEYS[3], id)  -- a fresh set of attempts
    redis.call('HDEL', KEYS[5], id)  -- and no reason: it is not dead any more
    redis.call('PERSIST', KEYS[13 + i])
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return {n, redis.call('ZCARD', KEYS[1])}
