-- run_now: waiting messages (pending or retry) -> ready, ahead of their due time.
-- KEYS[1] pending zset   KEYS[2] retry zset   KEYS[3] ready list   KEYS[4] tokens hash
-- KEYS[5] ready_since hash   KEYS[6] ranked zset   KEYS[7] priorities hash
-- KEYS[8] flow_keys hash   KEYS[9] key_turns zset   KEYS[10] key_waiting zset
-- KEYS[11] key_state hash   KEYS[12] key_tats zset   KEYS[13] key_lists prefix
-- KEYS[14] key_load zset
-- ARGV[1] now (ms)   ARGV[2] wake channel   ARGV[3..] ids
-- returns: number of messages moved
-- They are overdue from now (recorded in ready_since), not from the due time in the envelope.
local pending, retry, ready, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ready_since, ranked, priorities, flow_keys = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key_turns, key_waiting, key_state, key_tats = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_lists, key_load = KEYS[13], KEYS[14]
--- @include "includes/guard.lua"
--- @include "includes/ready_list.lua"
guard(
  pending, 'zset', retry, 'zset', ready, 'list', tokens, 'hash', ready_since, 'hash',
  ranked, 'zset', priorities, 'hash'
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
  if redis.call('ZREM', pending, id) == 1 or redis.call('ZREM', retry, id) == 1 then
    back_to_ready(ready, ranked, priorities, tokens, ready_since, id, ARGV[1], K)
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return n
