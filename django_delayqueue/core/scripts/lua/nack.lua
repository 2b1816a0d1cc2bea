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
-- longer current)
-- Each message is read before it is moved: an attempt count that is not a number sends it to
-- garbage with a reason naming the value, instead of failing after it left unack.
-- A message with a successor (scheduled with replace=True while it ran) keeps it through its
-- retries; when it dies instead, the successor takes its place as a new message (what its
-- caller asked for: replace=True replaces a dead message too), announced like schedule.lua's.
-- An aborted delivery (abort.lua) goes to garbage with the abort's reason, never to retry.
-- The delivery's progress (progress.lua) goes: a retry starts without one.
-- A keyed delivery that ends frees its key's slot (includes/key_turns.lua); a successor taking
-- a dead message's place brings its own key.
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/aborts.lua"
--- @include "includes/placing.lua"
guard(
  KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash',
  KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'hash', KEYS[9], 'zset', KEYS[10], 'list',
  KEYS[11], 'hash', KEYS[12], 'hash', KEYS[13], 'hash', KEYS[20], 'hash'
)
-- A dying message's successor may bring the queue's first key: checked then too.
if redis.call('HLEN', KEYS[13]) > 0 or redis.call('EXISTS', KEYS[7]) == 1 then
  guard(KEYS[14], 'zset', KEYS[15], 'zset', KEYS[16], 'hash', KEYS[17], 'zset', KEYS[19], 'zset')
end
local K = keyed_keys(13)
local now, max_attempts = tonumber(ARGV[1]), tonumber(ARGV[2])
local horizon = now + tonumber(ARGV[3])
local results, wake = {}, nil
for i = 5, #ARGV, 4 do
  local id, retry_at, reason = ARGV[i], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local result = 0
  if redis.call('HGET', KEYS[5], id) == ARGV[i + 1] and redis.call('ZSCORE', KEYS[1], id) then
    local attempts, bad = attempt_count(redis.call('HGET', KEYS[4], id))
    local aborted = take_abort(KEYS[12], id, ARGV[i + 1])
    local dead = 2
    redis.call('HDEL', KEYS[20], id)
    redis.call('ZREM', KEYS[1], id)
    key_slot_freed(K, id, now)
    if bad then
      reason = bad .. ': ' .. reason
      retry_at = -1
    elseif aborted then
      reason = aborted
      retry_at = -1
      dead = 3
    elseif retry_at >= 0 and attempts >= max_attempts then
      reason = 'no attempts left (' .. attempts .. ' of ' .. max_attempts .. '): ' .. reason
      retry_at = -1
    end
    if retry_at >= 0 then
      redis.call('ZADD', KEYS[2], retry_at, id)
      redis.call('HSET', KEYS[6], id, reason)
      result = 1
    elseif redis.call('HEXISTS', KEYS[7], id) == 1 then
      for key = 4, 6 do redis.call('HDEL', KEYS[key], id) end
      local _, at = succeed(
        KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], id, now, horizon, K
      )
      wake = earlier(wake, at)
      result = dead
    else
      redis.call('ZADD', KEYS[3], now, id)
      redis.call('HSET', KEYS[6], id, reason)
      result = dead
    end
  end
  results[#results + 1] = result
end
if wake ~= nil then redis.call('PUBLISH', ARGV[4], tostring(wake)) end
return results
