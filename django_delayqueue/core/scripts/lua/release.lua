-- release: claimed deliveries that never started (consumer shutting down) -> front of ready,
-- without using up an attempt.
-- KEYS[1] unack zset   KEYS[2] ready list   KEYS[3] attempts hash   KEYS[4] tokens hash
-- KEYS[5] garbage zset   KEYS[6] reasons hash   KEYS[7] ready_since hash   KEYS[8] ranked zset
-- KEYS[9] priorities hash   KEYS[10] aborts hash
-- KEYS[11] flow_keys hash   KEYS[12] key_turns zset   KEYS[13] key_waiting zset
-- KEYS[14] key_state hash   KEYS[15] key_tats zset   KEYS[16] key_lists prefix
-- KEYS[17] key_load zset
-- KEYS[18] progress hash
-- ARGV[1] now (ms)   ARGV[2] wake channel
-- ARGV[3..] triples: id, token, when it came back to ready (ms: the ready_since its claim
--   returned; '' for none)
-- returns: number of messages released (a stale token or a reaped message is skipped)
-- A message with a priority goes to the head of its priority in the ranked zset.
-- Announces them on the wake channel so an idle consumer claims them at once. A redelivery is
-- overdue from now (recorded in ready_since), not from the due time of its first delivery; from
-- the instant it came back to ready if that is later (a retry claimed up to one claim lead before
-- its retry time and given back in those milliseconds: its next consumer holds it until then,
-- so that it never starts before its retry time). A message whose
-- attempt count is not a number cannot be given its attempt back: it goes to garbage with a
-- reason naming the value (read before anything is written, unlike a failing HINCRBY).
-- An aborted one (abort.lua) goes to garbage with the abort's reason instead. Its progress
-- (progress.lua) goes either way.
-- A keyed message goes to the head of its key's list, its slot freed (includes/key_turns.lua).
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/aborts.lua"
--- @include "includes/ready_list.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'list', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'zset',
  KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'zset', KEYS[9], 'hash', KEYS[10], 'hash',
  KEYS[18], 'hash'
)
if redis.call('HLEN', KEYS[11]) > 0 then
  guard(KEYS[12], 'zset', KEYS[13], 'zset', KEYS[14], 'hash', KEYS[15], 'zset', KEYS[17], 'zset')
end
local K = keyed_keys(11)
local n = 0
local now = tonumber(ARGV[1])
for i = #ARGV - 2, 3, -3 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[4], id) == ARGV[i + 1] and redis.call('ZSCORE', KEYS[1], id) then
    local attempts, bad = attempt_count(redis.call('HGET', KEYS[3], id))
    local aborted = take_abort(KEYS[10], id, ARGV[i + 1])
    redis.call('HDEL', KEYS[18], id)
    redis.call('ZREM', KEYS[1], id)
    key_slot_freed(K, id, tonumber(ARGV[1]))
    if bad then
      redis.call('ZADD', KEYS[5], ARGV[1], id)
      redis.call('HSET', KEYS[6], id, bad .. ': released unstarted')
    elseif aborted then
      redis.call('ZADD', KEYS[5], ARGV[1], id)
      redis.call('HSET', KEYS[6], id, aborted)
    else
      to_ready(KEYS[2], KEYS[8], KEYS[9], {id}, true, K)
      if attempts > 1 then
        redis.call('HSET', KEYS[3], id, attempts - 1)
        local since = tonumber(ARGV[i + 2])
        redis.call('HSET', KEYS[7], id, (since and since > now) and ARGV[i + 2] or ARGV[1])
      else
        redis.call('HDEL', KEYS[3], id)
      end
      redis.call('HDEL', KEYS[4], id)
      n = n + 1
    end
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return n
