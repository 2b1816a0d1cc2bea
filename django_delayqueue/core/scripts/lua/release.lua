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
local unack, ready, attempts, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local garbage, reasons, ready_since, ranked = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local priorities, aborts, flow_keys, key_turns = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local key_waiting, key_state, key_tats, key_lists = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_load, progress = KEYS[17], KEYS[18]
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/aborts.lua"
--- @include "includes/ready_list.lua"
guard(
  unack, 'zset', ready, 'list', attempts, 'hash', tokens, 'hash', garbage, 'zset',
  reasons, 'hash', ready_since, 'hash', ranked, 'zset', priorities, 'hash', aborts, 'hash',
  progress, 'hash'
)
if redis.call('HLEN', flow_keys) > 0 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
end
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local n = 0
local now = tonumber(ARGV[1])
for i = #ARGV - 2, 3, -3 do
  local id = ARGV[i]
  if redis.call('HGET', tokens, id) == ARGV[i + 1] and redis.call('ZSCORE', unack, id) then
    local attempt, bad = attempt_count(redis.call('HGET', attempts, id))
    local aborted = take_abort(aborts, id, ARGV[i + 1])
    redis.call('HDEL', progress, id)
    redis.call('ZREM', unack, id)
    key_slot_freed(K, id, tonumber(ARGV[1]))
    if bad then
      redis.call('ZADD', garbage, ARGV[1], id)
      redis.call('HSET', reasons, id, bad .. ': released unstarted')
    elseif aborted then
      redis.call('ZADD', garbage, ARGV[1], id)
      redis.call('HSET', reasons, id, aborted)
    else
      to_ready(ready, ranked, priorities, {id}, true, K)
      if attempt > 1 then
        redis.call('HSET', attempts, id, attempt - 1)
        local since = tonumber(ARGV[i + 2])
        redis.call('HSET', ready_since, id, (since and since > now) and ARGV[i + 2] or ARGV[1])
      else
        redis.call('HDEL', attempts, id)
      end
      redis.call('HDEL', tokens, id)
      n = n + 1
    end
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '0') end
return n
