-- nack: a delivery failed; unack -> retry at a given time, or -> garbage when no attempts are
-- left (or the caller asks for it with retry-at -1).
-- KEYS[1] unack zset   KEYS[2] retry zset   KEYS[3] garbage zset   KEYS[4] attempts hash
-- KEYS[5] tokens hash   KEYS[6] reasons hash   KEYS[7] successors hash   KEYS[8] messages hash
-- KEYS[9] pending zset   KEYS[10] ready list   KEYS[11] priorities hash   KEYS[12] aborts hash
-- KEYS[13] flow_keys hash   KEYS[14] key_turns zset   KEYS[15] key_waiting zset
-- KEYS[16] key_state hash   KEYS[17] key_tats zset   KEYS[18] key_lists prefix
-- KEYS[19] key_load zset
-- KEYS[20] progress hash
-- ARGV[1] now (ms)   ARGV[2] max attempts   ARGV[3] announce horizon (ms)   ARGV[4] wake channel
-- ARGV[5..] quadruples: id, token, retry-at (ms, or -1 for straight to garbage), reason
-- returns: one integer per message: 1 retry, 2 garbage, 3 garbage because it was aborted (its
-- caller may have asked for a retry: it records an abort's outcome instead), 0 stale (token no
-- longer current); then, for each 3 in order, the dead letters' reason it was given ("aborted"
-- or "aborted: <the abort's reason>"), so that its caller's records say what the dead letter
-- says (the abort's entry is gone by then)
-- Each message is read before it is moved: an attempt count that is not a number sends it to
-- garbage with a reason naming the value, instead of failing after it left unack.
-- A message with a successor (scheduled with replace=True while it ran) keeps it through its
-- retries; when it dies instead, the successor takes its place as a new message (what its
-- caller asked for: replace=True replaces a dead message too), announced like schedule.lua's.
-- An aborted delivery (abort.lua) goes to garbage with the abort's reason, never to retry.
-- The delivery's progress (progress.lua) goes: a retry starts without one.
-- A keyed delivery that ends frees its key's slot (includes/key_turns.lua); a successor taking
-- a dead message's place brings its own key.
local unack, retry, garbage, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local tokens, reasons, successors, messages = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local pending, ready, priorities, aborts = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local flow_keys, key_turns, key_waiting, key_state = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_tats, key_lists, key_load, progress = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/aborts.lua"
--- @include "includes/placing.lua"
guard(
  unack, 'zset', retry, 'zset', garbage, 'zset', attempts, 'hash', tokens, 'hash',
  reasons, 'hash', successors, 'hash', messages, 'hash', pending, 'zset', ready, 'list',
  priorities, 'hash', aborts, 'hash', flow_keys, 'hash', progress, 'hash'
)
-- A dying message's successor may bring the queue's first key: checked then too.
if redis.call('HLEN', flow_keys) > 0 or redis.call('EXISTS', successors) == 1 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
end
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local now, max_attempts = tonumber(ARGV[1]), tonumber(ARGV[2])
local horizon = now + tonumber(ARGV[3])
local results, wake, aborted_reasons = {}, nil, {}
for i = 5, #ARGV, 4 do
  local id, retry_at, reason = ARGV[i], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local result = 0
  if redis.call('HGET', tokens, id) == ARGV[i + 1] and redis.call('ZSCORE', unack, id) then
    local attempt, bad = attempt_count(redis.call('HGET', attempts, id))
    local aborted = take_abort(aborts, id, ARGV[i + 1])
    local dead = 2
    redis.call('HDEL', progress, id)
    redis.call('ZREM', unack, id)
    key_slot_freed(K, id, now)
    if bad then
      reason = bad .. ': ' .. reason
      retry_at = -1
    elseif aborted then
      reason = aborted
      retry_at = -1
      dead = 3
      aborted_reasons[#aborted_reasons + 1] = aborted
    elseif retry_at >= 0 and attempt >= max_attempts then
      reason = 'no attempts left (' .. attempt .. ' of ' .. max_attempts .. '): ' .. reason
      retry_at = -1
    end
    if retry_at >= 0 then
      redis.call('ZADD', retry, retry_at, id)
      redis.call('HSET', reasons, id, reason)
      result = 1
    elseif redis.call('HEXISTS', successors, id) == 1 then
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', tokens, id)
      redis.call('HDEL', reasons, id)
      local _, at = succeed(
        successors, messages, pending, ready, priorities, id, now, horizon, K
      )
      wake = earlier(wake, at)
      result = dead
    else
      redis.call('ZADD', garbage, now, id)
      redis.call('HSET', reasons, id, reason)
      result = dead
    end
  end
  results[#results + 1] = result
end
if wake ~= nil then redis.call('PUBLISH', ARGV[4], tostring(wake)) end
for _, told in ipairs(aborted_reasons) do results[#results + 1] = told end
return results
