-- run_now: waiting messages (pending or retry) -> ready, ahead of their due time.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] tokens hash
-- KEYS[5] ready_since hash   KEYS[6] ranked zset   KEYS[7] priorities hash
-- KEYS[8] flow_keys hash   KEYS[9] key_turns zset   KEYS[10] key_waiting zset
-- KEYS[11] key_state hash   KEYS[12] key_tats zset   KEYS[13] key_lists prefix
-- KEYS[14] key_load zset
-- ARGV[1] now (ms)   ARGV[2] wake channel   ARGV[3..] ids
-- returns: number of messages moved
-- They are overdue from now (recorded in ready_since), not from the due time in the envelope.
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'list', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'zset', KEYS[7], 'hash'
)
if redis.call('HLEN', KEYS[8]) > 0 then
  guard(KEYS[9], 'zset', KEYS[10], 'zset', KEYS[11], 'hash', KEYS[12], 'zset', KEYS[14], 'zset')
end
local K = keyed_keys(8)
local n = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 or redis.call('ZREM', KEYS[2], id) == 1 then
    back_to_ready(KEYS[3], KEYS[6], KEYS[7], KEYS[4], KEYS[5], id, ARGV[1], K)
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return n
