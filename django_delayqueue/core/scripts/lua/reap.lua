-- reap: deliveries whose visibility deadline passed (their consumer died or hung) -> retry,
-- or -> garbage when that was the last attempt. Bounded per call.
-- KEYS[1] unack zset   KEYS[2] retry zset   KEYS[3] garbage zset   KEYS[4] attempts hash
-- KEYS[5] reasons hash   KEYS[6] tokens hash   KEYS[7] successors hash   KEYS[8] messages hash
-- KEYS[9] pending zset   KEYS[10] ready list   KEYS[11] priorities hash   KEYS[12] aborts hash
-- KEYS[13] flow_keys hash   KEYS[14] key_turns zset   KEYS[15] key_waiting zset
-- KEYS[16] key_state hash   KEYS[17] key_tats zset   KEYS[18] key_lists prefix
-- KEYS[19] key_load zset
-- KEYS[20] progress hash
-- ARGV[1] now (ms)   ARGV[2] limit   ARGV[3] max attempts
-- ARGV[4] backoff base (ms)   ARGV[5] backoff max (ms)
-- ARGV[6] announce horizon (ms)   ARGV[7] wake channel
-- returns: {retried, buried, more (1 when more deadlines have passed), next deadline or -1}
-- Tokens are kept: a late ack of the reaped delivery is still accepted until it is redelivered.
-- An attempt count that is not a number sends the message to garbage with a reason naming the
-- value (read before the message leaves unack: a script error then would lose it).
-- A message with a successor (see nack.lua) keeps it when retried; when it dies, the successor
-- takes its place (and the dead delivery's token goes: its late ack must not touch the new one).
-- An aborted delivery (abort.lua) goes to garbage with the abort's reason, never to retry.
-- The delivery's progress (progress.lua) goes: a retry starts without one.
-- A keyed delivery that ends frees its key's slot (includes/key_turns.lua); a successor taking
-- a dead message's place brings its own key.
local unack, retry, garbage, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local reasons, tokens, successors, messages = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local pending, ready, priorities, aborts = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local flow_keys, key_turns, key_waiting, key_state = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local key_tats, key_lists, key_load, progress = KEYS[17], KEYS[18], KEYS[19], KEYS[20]
--- @include "includes/guard.lua"
--- @include "includes/attempts.lua"
--- @include "includes/aborts.lua"
--- @include "includes/placing.lua"
local now, limit, max_attempts = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local base, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local function head()
  local first = redis.call('ZRANGE', unack, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2]) or -1
end
-- Nothing past its deadline (the usual case) costs one read.
local next_deadline = head()
if next_deadline == -1 or next_deadline > now then return {0, 0, 0, next_deadline} end
guard(
  unack, 'zset', retry, 'zset', garbage, 'zset', attempts, 'hash', reasons, 'hash',
  tokens, 'hash', successors, 'hash', messages, 'hash', pending, 'zset', ready, 'list',
  priorities, 'hash', aborts, 'hash', flow_keys, 'hash', progress, 'hash'
)
-- A dying message's successor may bring the queue's first key: checked then too.
if redis.call('HLEN', flow_keys) > 0 or redis.call('EXISTS', successors) == 1 then
  guard(
    key_turns, 'zset', key_waiting, 'zset', key_state, 'hash', key_tats, 'zset', key_load, 'zset'
  )
end
local K = keyed_keys(flow_keys, key_turns, key_waiting, key_state, key_tats, key_lists, key_load)
local horizon, wake = now + tonumber(ARGV[6]), nil
local function bury(id, reason)
  if redis.call('HEXISTS', successors, id) == 1 then
    redis.call('HDEL', attempts, id)
    redis.call('HDEL', reasons, id)
    redis.call('HDEL', tokens, id)
    local _, at = succeed(
        successors, messages, pending, ready, priorities, id, now, horizon, K
      )
    wake = earlier(wake, at)
  else
    redis.call('ZADD', garbage, now, id)
    redis.call('HSET', reasons, id, reason)
  end
end
local ids = redis.call('ZRANGEBYSCORE', unack, '-inf', now, 'LIMIT', 0, limit)
local retried, buried = 0, 0
for _, id in ipairs(ids) do
  local attempt, bad = attempt_count(redis.call('HGET', attempts, id))
  local aborted = take_abort(aborts, id, redis.call('HGET', tokens, id))
  redis.call('HDEL', progress, id)
  redis.call('ZREM', unack, id)
  key_slot_freed(K, id, now)
  if bad then
    bury(id, bad .. ': visibility timeout passed')
    buried = buried + 1
  elseif aborted then
    bury(id, aborted)
    buried = buried + 1
  elseif attempt >= max_attempts then
    bury(id, 'visibility timeout passed on the last attempt (' .. attempt .. ' of ' ..
      max_attempts .. '): the consumer died or hung')
    buried = buried + 1
  else
    local delay = math.min(cap, base * 2 ^ math.max(0, attempt - 1))
    redis.call('ZADD', retry, now + delay, id)
    redis.call('HSET', reasons, id, 'visibility timeout passed on attempt ' .. attempt)
    retried = retried + 1
  end
end
if wake ~= nil then redis.call('PUBLISH', ARGV[7], tostring(wake)) end
next_deadline = head()
-- Only when a passed deadline is left: a batch of exactly `limit` may have taken the last.
local more = (next_deadline ~= -1 and next_deadline <= now) and 1 or 0
return {retried, buried, more, next_deadline}
